"""The top-k KL's gap on SmolLM2-135M (docs/hf.md, "Distillation at scale"): the full KL to
the original, the top-64 KL (what distillation from a TeacherCache trains on), the teacher's
mass outside the top 64, and favor.hf.kl.tail_bound's bound on the gap, per token, over 2
windows of 1024 of three held-out domains, for the untrained positive-fit hybrid and a
train.py adapter:

    python examples/hf/smollm2/tail_gap.py runs/pf1m/adapter
"""
import copy
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import corpus  # noqa: E402
import smollm2  # noqa: E402


def main():
    import favor.hf as fh
    from favor.hf.kl import TopK, tail_bound, topk_of
    teacher, tok = smollm2.load()
    c = corpus.build(tok, os.path.join("runs", "corpus"))
    rows = {}
    for name, path in {"untrained": None, "distilled": sys.argv[1]}.items():
        if path is None:
            s = copy.deepcopy(teacher)
            fh.convert(s, "positive-fit", features=128, window=64, sinks=4, seed=0)
        else:
            s = fh.from_pretrained(path, base=copy.deepcopy(teacher))
        tot = {"full": 0.0, "topk": 0.0, "p_r": 0.0, "bound": 0.0}
        n = 0
        for dom in ("python-packages", "rust-books", "shakespeare"):
            for w in smollm2.windows(c.held_out(dom), 1024, 2).split(1):
                with torch.no_grad():
                    t = teacher(input_ids=w, use_cache=False).logits[0].double()
                    z = s(input_ids=w, use_cache=False).logits[0].double()
                tl, zl = t.log_softmax(-1), z.log_softmax(-1)
                full = (tl.exp() * (tl - zl)).sum(-1)
                idx, lp, rest = topk_of(t, 64)
                inside = torch.zeros_like(t, dtype=torch.bool).scatter(-1, idx, True)
                p_r = (tl.exp() * ~inside).sum(-1)
                q_r = (zl.exp() * ~inside).sum(-1)
                topk = (tl.exp() * (tl - zl) * inside).sum(-1) + p_r * (p_r.log() - q_r.log())
                bound = tail_bound(z.float(), TopK(idx, lp, rest))
                for key, v in (("full", full), ("topk", topk), ("p_r", p_r), ("bound", bound)):
                    tot[key] += float(v.sum())
                n += full.numel()
        rows[name] = {k: v / n for k, v in tot.items()}
        print(name, rows[name], flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
