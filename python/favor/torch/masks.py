"""Recognising torch attention masks favor can honour: only the causal one."""
import torch

from .. import _core


def _causal_pattern(n, s):
    return torch.ones(n, s, dtype=torch.bool).triu(1)  # True where key j > query i


def is_causal_mask(mask):
    """True when mask is torch's causal mask: bool with True exactly above the diagonal,
    or float with -inf above and 0 on and below it (nn.Transformer's
    generate_square_subsequent_mask); [L, L], or [N*H, L, L] with every slice so."""
    if mask.dim() not in (2, 3) or mask.shape[-1] != mask.shape[-2]:
        return False
    above = _causal_pattern(mask.shape[-1], mask.shape[-1]).to(mask.device)
    if mask.dtype == torch.bool:
        return bool(torch.all(mask == above))
    if mask.is_floating_point():
        return bool(torch.all(torch.where(above, torch.isneginf(mask), mask == 0)))
    return False


def resolve_causal(attn_mask, is_causal, module_causal):
    """Whether attention is causal, from the module's flag, torch's is_causal hint and
    attn_mask; any attn_mask other than the causal one is refused."""
    if attn_mask is None:
        return bool(module_causal or is_causal)
    if not isinstance(attn_mask, torch.Tensor):
        raise _core.Error(f"attn_mask: expected a torch.Tensor, got {type(attn_mask).__name__}")
    if not is_causal_mask(attn_mask):
        raise _core.Error(
            f"attn_mask: a mask of shape {list(attn_mask.shape)} and dtype {attn_mask.dtype} "
            "that is not the causal mask; favor never forms the L x S attention weights, so it "
            "honours only the causal mask (True / -inf above the diagonal) and key_padding_mask")
    return True
