"""What attention transfer captures: inside capturing(), every converted layer attends
exactly (softmax, as the original model) and records its queries, keys, values, padding and
causality per layer (favor.hf.transfer fits each layer's map to them)."""
import threading
from contextlib import contextmanager

from ..torch.function import attention as favor_attention_op

_capture = threading.local()


@contextmanager
def capturing():
    """Yields {layer: [(q, k, v, keep, causal), ...]} (float32, detached; keep [B, N] or
    None), filled by every converted layer's calls inside the block."""
    records = {}
    _capture.records = records
    try:
        yield records
    finally:
        _capture.records = None


def captured(module, q, k, v, keep, causal):
    """favor_attention's hook: None outside capturing(), else the exact output."""
    records = getattr(_capture, "records", None)
    if records is None:
        return None
    records.setdefault(module.layer_idx, []).append(
        (q.detach(), k.detach(), v.detach(), None if keep is None else keep.clone(), causal))
    return exact(module.favor_core, q, k, v, keep, causal)


def exact(core, q, k, v, keep, causal):
    """Softmax attention with the core's scale (favor's exact kernel); keep: True = real."""
    return favor_attention_op(q, k, v, causal=causal, method="exact", scale=core.scale,
                              key_padding_mask=None if keep is None else ~keep)
