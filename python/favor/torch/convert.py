"""favor.torch.convert: put favor's attention into an existing model."""
import warnings

from torch import nn

from .. import _core
from ..feature_map import FeatureMap
from .mha import MultiheadAttention
from .vq_mha import VQMultiheadAttention


def convert(model, *, init=None, **options):
    """Replaces every torch.nn.MultiheadAttention inside `model` (in place) by
    favor.torch.MultiheadAttention with the same configuration, trained weights, dtype and
    train/eval mode. options: the favor keywords of MultiheadAttention (kernel, features,
    projection, norms, seed, method, feature_redraw_interval, learn_projection, scale, fit,
    learn_features, feature_weights, decay, learn_decay).
    Learned feature maps (DiJiang's and Hedgehog's conversion): kernel='hedgehog' learns the
    map (per-head W and b: learn_features defaults to True); init is where the map starts:
    'projection' (W = the drawn projection, b = 0, lambda = 1) or a favor.FeatureMap (e.g.
    from favor.fit_features; heads 1 or num_heads), whose kernel, features and scale become
    the defaults. The map's parameters are trainable (model.parameters() holds them).
    decay (and learn_decay) applies to the causal calls of the converted modules (e.g. a
    decoder's self-attention called with tgt_is_causal=True, which nn.TransformerDecoder
    passes when its tgt_mask is the causal mask); their non-causal calls (an
    encoder's unmasked self-attention, cross-attention) run without decay.
    method='vq' puts in favor.torch.VQMultiheadAttention instead, with its keywords (codes,
    tau, decay, dead_after, beta, learn_codebook, scale, block, seed): each codebook is
    initialised by k-means on the keys of the first forward call (run one batch before
    evaluating). Returns {qualified name: the replaced torch module}, in model order.

    The converted model runs favor in training and in eval: torch's fused
    TransformerEncoder(Layer) fast path, which would bypass the attention module, is not
    taken for favor's module (see MultiheadAttention._qkv_same_embed_dim).
    """
    if isinstance(model, nn.MultiheadAttention):
        raise _core.Error("model: is itself an nn.MultiheadAttention; convert its parent, or use "
                          "favor.torch.MultiheadAttention.from_torch(model)")
    if not isinstance(model, nn.Module):
        raise _core.Error(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if init is not None:
        if options.get("method") == "vq":
            raise _core.Error("init: method='vq' has no feature map to initialise")
        if isinstance(init, FeatureMap):
            options.setdefault("kernel", init.kernel)
            options.setdefault("features", init.m)
            options.setdefault("scale", init.scale)
            options.setdefault("feature_weights", init.lambda_ is not None)
        options.setdefault("learn_features", True)
        options["feature_init"] = init
    if options.get("kernel") == "hedgehog":
        options.setdefault("learn_features", True)
    cls = MultiheadAttention
    if options.get("method") == "vq":
        cls = VQMultiheadAttention
        options = {k: v for k, v in options.items() if k != "method"}
    replaced = {}
    dropped = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                qualified = f"{parent_name}.{name}" if parent_name else name
                setattr(parent, name, cls.from_torch(child, **options))
                replaced[qualified] = child
                if child.dropout > 0:
                    dropped.append(qualified)
    # torch 2.x's nn.TransformerEncoder decides at construction, from its first layer's
    # attention, whether to pack padded batches into nested tensors in eval (its fast path);
    # favor's module takes dense tensors, so an encoder whose attention was replaced keeps
    # them dense (use_nested_tensor is the attribute its forward reads).
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoder) and replaced:
            module.use_nested_tensor = False
    if dropped:
        warnings.warn(f"favor.torch.convert: attention-weight dropout is not applied by favor "
                      f"(it never forms the weights) in {', '.join(dropped)}", stacklevel=2)
    return replaced
