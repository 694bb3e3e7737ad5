"""Attention presets by name (the --attention of examples/shakespeare): what training and
conversion both accept, so that neither imports the other for it."""
import re

from .. import _core
from .char_transformer import attention_spec


def attention_preset(name):
    """An attention spec from a preset name or a JSON object:
    exact; favor-orth-M / favor-iid-M (FAVOR+, positive features, M of them);
    trig-orth-M; hedgehog-M (learned hedgehog map, M features); vq-C (Transformer-VQ, C
    codes); or '{"method": "favor", "kernel": "favorpp", "features": 64, "fit": 0.1}'."""
    name = name.strip()
    if name.startswith("{"):
        return attention_spec(name)
    if name == "exact":
        return {"method": "exact"}
    m = re.fullmatch(r"(favor|trig)-(orth|iid)-(\d+)", name)
    if m:
        kernel = "positive" if m.group(1) == "favor" else "trig"
        projection = "orthogonal" if m.group(2) == "orth" else "iid"
        return {"method": "favor", "kernel": kernel, "features": int(m.group(3)),
                "projection": projection}
    m = re.fullmatch(r"hedgehog-(\d+)", name)
    if m:
        return {"method": "favor", "kernel": "hedgehog", "features": int(m.group(1)),
                "learn_features": True}
    m = re.fullmatch(r"vq-(\d+)", name)
    if m:
        return {"method": "vq", "codes": int(m.group(1))}
    raise _core.Error(f"attention: unknown preset {name!r}; use exact, favor-orth-M, "
                      "favor-iid-M, trig-orth-M, hedgehog-M, vq-C or a JSON object")
