"""What favor's attention cores (FavorCore, VQCore) share as modules: the names of their
state_dict tensors, and loading a state_dict that lacks them."""
from torch import nn


class AttentionCore(nn.Module):
    TENSORS = ()  # its state_dict tensors (an owner renames their flat keys)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A state_dict without the core's tensors (torch's nn.MultiheadAttention, which
        # favor.torch.convert loads; a Hugging Face checkpoint) keeps the initial ones: a
        # FavorCore its drawn projection and map, a VQCore its codebook, initialised by
        # k-means on the first batch.
        for name in self.TENSORS:
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)
