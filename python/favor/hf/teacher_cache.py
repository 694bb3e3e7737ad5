"""favor.hf.TeacherCache: a teacher's next-token distributions computed once per calibration
set and kept on disk, so that every row of a study and every resumed run distils from them
without running the teacher again (docs/hf.md, "Distillation at scale").

    cache = favor.hf.TeacherCache("runs/teacher-k64", teacher, k=64)
    cache.fill(batches)                                     # optional: all at once, a bar
    favor.hf.distill(student, cache, batches, steps=1000)   # missing entries made on the way

What is kept per position is the teacher's top k (favor.hf.kl.TopK: the k token ids, their
log-probabilities at the temperature, and the log of the mass of every other token); the
loss distill computes from it is KL over k + 1 outcomes, never above the full KL, and the
gap is bounded in favor.hf.kl's docstring (tested).

The format, one folder:
- teacher.json: {"format": 1, "k", "temperature", "precision" ("float32" or "bf16": the
  teacher's forward), "vocab", "teacher" (favor.hf.adapters.base_digest of the teacher's
  weights)}. A folder made with other settings or another teacher is refused by name.
- one <sha256>.safetensors per batch, named by the SHA-256 of the batch's input_ids (int64,
  C order, with its shape) and attention_mask: tensors "index" (int32 [B, N, k]), "logp"
  (float32 [B, N, k]) and "rest" (float32 [B, N]). Written to a temporary name and renamed,
  so an interrupted run leaves whole entries only.
"""
import hashlib
import json
import os

import torch

from .. import _core
from .kl import TopK, topk_of
from .precision import low_precision

FORMAT = 1
META = "teacher.json"
PRECISIONS = ("float32", "bf16")


class TeacherCache:
    """The teacher's top-k next-token distributions in `folder` (module docstring). teacher:
    the model that makes missing entries (None: read only; a missing entry is then an
    error). k: tokens kept per position; temperature: the distillation's T; precision: the
    teacher's forward, 'float32' or 'bf16' (autocast, its Linear weights in bfloat16 while
    it runs)."""

    def __init__(self, folder, teacher=None, *, k=64, temperature=1.0, precision="float32"):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise _core.Error(f"k: {k!r} must be an integer >= 1")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not 0 < temperature < float("inf"):
            raise _core.Error(f"temperature: {temperature!r} must be a finite number > 0")
        if precision not in PRECISIONS:
            raise _core.Error(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
        self.folder, self.teacher = folder, teacher
        self.k, self.temperature, self.precision = k, float(temperature), precision
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, META)
        if os.path.exists(path):
            with open(path) as f:
                self.meta = json.load(f)
            want = {"format": FORMAT, "k": k, "temperature": self.temperature,
                    "precision": precision}
            have = {key: self.meta.get(key) for key in want}
            if have != want:
                raise _core.Error(f"folder: {folder} holds a teacher cache with {have}; these "
                                  f"settings are {want} (use another folder)")
            if teacher is not None:
                self._check_teacher(teacher)
        else:
            if teacher is None:
                raise _core.Error(f"teacher: {folder} holds no teacher cache yet; give the "
                                  "teacher that fills it")
            self.meta = {"format": FORMAT, "k": k, "temperature": self.temperature,
                         "precision": precision,
                         "vocab": int(teacher.get_output_embeddings().weight.shape[0]),
                         "teacher": _digest(teacher)}
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.meta, f, indent=1)
            os.replace(tmp, path)
        self.made = 0  # entries this object computed (the rest were read)

    def _check_teacher(self, teacher):
        if _digest(teacher) != self.meta["teacher"]:
            raise _core.Error(f"teacher: its weights are not those {self.folder} was made "
                              "with (another model, or changed since)")

    def __len__(self):
        return sum(1 for n in os.listdir(self.folder) if n.endswith(".safetensors"))

    def path(self, inputs):
        """The file of a batch (a dict of model inputs or an input_ids tensor)."""
        return os.path.join(self.folder, key(inputs) + ".safetensors")

    def has(self, inputs):
        return os.path.exists(self.path(inputs))

    def get(self, inputs):
        """The batch's TopK over its flattened positions [B * N]: read, or made by the
        teacher (and stored) when missing."""
        from safetensors.torch import load_file, save_file
        path = self.path(inputs)
        if os.path.exists(path):
            t = load_file(path)
        else:
            if self.teacher is None:
                raise _core.Error(f"batches: a batch has no entry in {self.folder} and no "
                                  "teacher was given to make it")
            t = self.compute(inputs)
            tmp = path + f".{os.getpid()}.tmp"
            save_file(t, tmp)
            os.replace(tmp, path)
            self.made += 1
        k = t["index"].shape[-1]
        return TopK(t["index"].reshape(-1, k), t["logp"].reshape(-1, k), t["rest"].reshape(-1))

    def compute(self, inputs):
        """The entry's tensors for one batch, from the teacher (no grad, no cache)."""
        inputs = _on(inputs, self.teacher)
        device = next(self.teacher.parameters()).device.type
        bf16 = self.precision == "bf16"
        # float32 means float32 even inside a bf16 distillation's autocast
        with torch.no_grad(), torch.autocast(device, enabled=bf16), \
                low_precision(bf16, self.teacher, frozen_only=False):
            logits = self.teacher(**inputs, use_cache=False).logits
        index, logp, rest = topk_of(logits, self.k, self.temperature)
        return {"index": index.to(torch.int32).cpu().contiguous(),
                "logp": logp.cpu().contiguous(), "rest": rest.cpu().contiguous()}

    def fill(self, batches, progress=True):
        """Makes every missing entry of `batches` (a tqdm bar); returns how many it made."""
        from .transfer import _bar, _inputs
        bar = _bar(len(batches), progress, "favor.hf.TeacherCache", "batch")
        made = 0
        # the teacher's weights cast once for the whole pass, not once a batch
        with low_precision(self.precision == "bf16", self.teacher, frozen_only=False):
            for batch in batches:
                inputs = _inputs(batch)
                if not self.has(inputs):
                    self.get(inputs)
                    made += 1
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return made


def key(inputs):
    """SHA-256 (hex) of a batch's input_ids and attention_mask: its entry's name."""
    from .transfer import _inputs
    inputs = _inputs(inputs)
    h = hashlib.sha256()
    for name in ("input_ids", "attention_mask"):
        t = inputs.get(name)
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().to("cpu", torch.int64).contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).numpy().tobytes())
    return h.hexdigest()


def _digest(model):
    from .adapters import base_digest
    return base_digest(model)


def _on(inputs, model):
    from .transfer import _inputs
    device = next(model.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in _inputs(inputs).items()}
