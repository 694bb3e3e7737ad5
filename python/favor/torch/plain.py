"""favor's estimators written in plain torch operations (the oracles of favor's ops, kept
beside each op in favor/ops/<op>/naive.py): FAVOR and learned maps materialised
(feature_map, attention_materialised, decay_matrix), FAVOR+ in linear time (favor_plus, the
plain-PyTorch baseline of favor.bench; its features materialised: favor_plus_features, the
input of fla's kernel in favor.bench_gpu), softmax_attention, hybrid attention materialised
(hybrid_attention), and Transformer-VQ materialised (vq_quantise, vq_distances,
vq_attention_materialised)."""
from ..ops.attention.naive import (attention_materialised, decay_matrix, favor_plus,  # noqa: F401
                                   favor_plus_features, feature_map, per_head)
from ..ops.exact.naive import softmax_attention  # noqa: F401
from ..ops.hybrid.naive import hybrid_attention  # noqa: F401
from ..ops.vq.naive import (vq_attention_materialised, vq_distances,  # noqa: F401
                            vq_quantise)
