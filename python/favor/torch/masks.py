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
    """Whether attention is causal, from the module's flag and torch 2.x's is_causal hint
    (with it, attn_mask is the causal mask and is not read: torch's own contract). Without
    the hint an attn_mask is refused: telling a causal mask from another costs O(L S), which
    favor does not spend; nn.TransformerEncoder and nn.TransformerDecoder pass is_causal."""
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise _core.Error(f"attn_mask: expected a torch.Tensor, got {type(attn_mask).__name__}")
    if is_causal or module_causal:
        return True
    if attn_mask is None:
        return False
    raise _core.Error(
        f"attn_mask: a mask of shape {list(attn_mask.shape)} without is_causal=True; favor "
        "never forms the L x S attention weights, so it honours only the causal mask, given "
        "as is_causal=True (with or without attn_mask), and key_padding_mask. For the causal "
        "mask, pass is_causal=True (favor.torch.is_causal_mask(mask) tells whether a mask is "
        "torch's causal mask, at O(L S) cost)")
