"""favor.hf.longrange: what a causal language model carries from beyond a window, measured on
any text. Each function takes any transformers causal LM (converted or not) and a 1D tensor
of token ids of a text; the reference (the original model) gives the scale.

- copy_recall: a passage, >= 512 tokens of other text, the passage again. The loss on the
  second reading against the first; `recovered` is the model's gain (first - second) as a
  fraction of the reference's. A model that sees only a window gains nothing (0); the
  original copies (its second reading costs a tenth of the first).
- passkey: a 5-digit number stated once at a depth of a filler text, then asked for; the
  greedy answer's exact-match accuracy per length and depth, and the answer's loss teacher
  forced: its first token (the decision to answer with a number) and the rest (the key's
  digits given that decision: about ln 10 = 2.3 nats a digit when the key is not seen, near
  0 when it is copied). A model can know the key and still lose the greedy answer on the
  first token; the two losses tell which.
- perplexity: exp(mean next-token loss) over windows of each length.
- agreement: the fraction of positions where the model's greedy next token (teacher forced)
  is the reference's.

    import favor.hf.longrange as lr
    rows = lr.suite(model, tokenizer, ids, reference=original)
    print(lr.table({"original": ref_rows, "converted": rows}))

Command line (a transformers directory, or favor's full save; a compact adapter on its
original with --adapter; --reference: the original to compare with):

    python -m favor.hf.longrange --model DIR [--adapter DIR] [--reference DIR] --text FILE

Deterministic: the passages, fillers and keys are drawn from `seed`.
"""
import argparse
import json
import math
import re
import sys

import torch

from .. import _core

INTRO = ("There is an important pass key hidden inside a lot of irrelevant text. Find it and "
         "remember it. I will quiz you about the pass key.\n\n")
NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"


def _ids(ids, name="ids"):
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype not in (torch.long,
                                                                               torch.int32):
        raise _core.Error(f"{name}: a 1D tensor of token ids (int64 or int32)")
    return ids.long()


def _nll(model, seq):
    """Per-token next-token loss [N - 1] (nats) of one sequence [N]."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=seq[None].to(device), use_cache=False).logits[0].float()
    return torch.nn.functional.cross_entropy(logits[:-1], seq[1:].to(device),
                                             reduction="none").cpu()


def copy_recall(model, ids, *, passage=160, gap=700, samples=4, reference=None, seed=0):
    """Copy recall (module docstring): `samples` passages of `passage` tokens from `ids`,
    each followed by `gap` (>= 512) tokens from elsewhere in the text and the passage again.
    Returns {"first", "second", "gain"} (mean nats per token over the passage's tokens after
    its first: the first reading, the second, first - second) and, with `reference`, its
    figures as "reference" and "recovered" = gain / reference's gain."""
    seqs = [seq for seq, _ in copy_batches(ids, passage=passage, gap=gap, samples=samples,
                                           seed=seed)]

    def measure(m):
        first = second = 0.0
        for seq in seqs:
            loss = _nll(m, seq)
            first += float(loss[:passage - 1].mean())
            second += float(loss[passage + gap:].mean())
        first, second = first / samples, second / samples
        return {"first": first, "second": second, "gain": first - second}

    out = measure(model)
    out.update(passage=passage, gap=gap, samples=samples, seed=seed)
    if reference is not None:
        ref = measure(reference)
        out["reference"] = ref
        out["recovered"] = out["gain"] / ref["gain"] if ref["gain"] > 0 else float("nan")
    return out


def copy_batches(ids, *, passage=160, gap=700, samples=4, seed=0):
    """The copy-recall sequences: [(ids [2 passage + gap], start)], a passage of `ids`, `gap`
    (>= 512) tokens from elsewhere in the text, the passage again (from index `start`).
    favor.hf.rank_layers takes them as its `recall`."""
    ids = _ids(ids)
    for name, value, least in (("passage", passage, 8), ("gap", gap, 512), ("samples", samples, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise _core.Error(f"{name}: {value!r} must be an integer >= {least}")
    if ids.numel() < 2 * (passage + gap):
        raise _core.Error(f"ids: {ids.numel()} tokens; copy recall with passage {passage} and "
                          f"gap {gap} needs at least {2 * (passage + gap)}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(samples):
        start = int(torch.randint(0, ids.numel() - passage - gap + 1, (1,), generator=g))
        text = ids[start:start + passage]
        while True:  # the filler: `gap` tokens that do not overlap the passage
            f = int(torch.randint(0, ids.numel() - gap + 1, (1,), generator=g))
            if f + gap <= start or f >= start + passage:
                break
        out.append((torch.cat([text, ids[f:f + gap], text]), passage + gap))
    return out


def passkey(model, tokenizer, ids, *, lengths=(1024, 4096), depths=(0.1, 0.5, 0.9),
            trials=1, seed=0):
    """Passkey retrieval (module docstring): per length (prompt tokens, filler from `ids`)
    and depth (where the key sits, a fraction of the filler), `trials` random 5-digit keys;
    the answer is right when the first number in the greedy continuation is the key.
    Returns {"accuracy": {length: {depth: fraction}}, "overall": {length: fraction},
    "nats": {length: {"first": ..., "rest": ...}}}: the mean loss (nats per token, teacher
    forced) of the answer's first token and of its other tokens, over depths and trials."""
    ids = _ids(ids)
    if trials < 1 or not lengths or not depths:
        raise _core.Error("trials, lengths, depths: at least one each")
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise _core.Error(f"depths: {d!r} must be in [0, 1]")
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    def encode(s):
        return torch.tensor(tokenizer(s, add_special_tokens=False)["input_ids"])
    intro, question = encode(INTRO), encode(QUESTION)
    accuracy, overall, nats = {}, {}, {}
    for length in lengths:
        rows, first, rest = {}, [], []
        for depth in depths:
            right = 0
            for _ in range(trials):
                key = str(int(torch.randint(10000, 100000, (1,), generator=g)))
                needle = encode(NEEDLE.format(key=key))
                room = length - intro.numel() - needle.numel() - question.numel()
                if room < 16 or room > ids.numel():
                    raise _core.Error(f"lengths: {length} does not fit this prompt and text "
                                      f"({ids.numel()} tokens of filler)")
                start = int(torch.randint(0, ids.numel() - room + 1, (1,), generator=g))
                filler = ids[start:start + room]
                at = int(round(depth * room))
                prompt = torch.cat([intro, filler[:at], needle, filler[at:], question])
                with torch.no_grad():
                    out = model.generate(prompt[None].to(device),
                                         attention_mask=torch.ones(1, prompt.numel(),
                                                                   dtype=torch.long,
                                                                   device=device),
                                         max_new_tokens=8, do_sample=False)
                    answer = tokenizer.decode(out[0, prompt.numel():].tolist())
                    target = encode(" " + key)  # the answer, as the prompt continues
                    seq = torch.cat([prompt, target])[None].to(device)
                    lp = model(input_ids=seq, use_cache=False).logits[
                        0, prompt.numel() - 1:-1].float().log_softmax(-1).cpu()
                loss = -lp.gather(-1, target[:, None]).squeeze(-1)
                first.append(float(loss[0]))
                if loss.numel() > 1:  # (a tokenizer may make the answer one token)
                    rest.append(float(loss[1:].mean()))
                found = re.search(r"\d+", answer)
                right += int(found is not None and found.group(0) == key)
            rows[depth] = right / trials
        accuracy[length] = rows
        overall[length] = sum(rows.values()) / len(rows)
        nats[length] = {"first": sum(first) / len(first),
                        "rest": sum(rest) / len(rest) if rest else None}
    return {"accuracy": accuracy, "overall": overall, "nats": nats, "trials": trials,
            "seed": seed}


def perplexity(model, ids, *, lengths=(1024, 4096), windows=2):
    """{length: perplexity} over `windows` consecutive windows of each length from the start
    of `ids` (each scored from its own first token)."""
    ids = _ids(ids)
    out = {}
    for length in lengths:
        n = min(windows, ids.numel() // length)
        if n < 1:
            raise _core.Error(f"lengths: {length} is longer than the text ({ids.numel()} "
                              "tokens)")
        total = sum(float(_nll(model, ids[i * length:(i + 1) * length]).sum())
                    for i in range(n))
        out[length] = math.exp(total / (n * (length - 1)))
    return out


def agreement(model, reference, ids, *, length=1024, windows=2):
    """The fraction of positions (teacher forced, `windows` windows of `length` from the
    start of `ids`) where the model's greedy next token is the reference's."""
    ids = _ids(ids)
    n = min(windows, ids.numel() // length)
    if n < 1:
        raise _core.Error(f"length: {length} is longer than the text ({ids.numel()} tokens)")
    same = total = 0
    for i in range(n):
        seq = ids[i * length:(i + 1) * length][None]
        with torch.no_grad():
            a = model(input_ids=seq.to(next(model.parameters()).device),
                      use_cache=False).logits.argmax(-1)
            b = reference(input_ids=seq.to(next(reference.parameters()).device),
                          use_cache=False).logits.argmax(-1)
        same += int((a.cpu() == b.cpu()).sum())
        total += a.numel()
    return same / total


def suite(model, tokenizer, ids, *, reference=None, lengths=(1024, 4096),
          passkey_lengths=(1024, 4096), depths=(0.1, 0.5, 0.9), trials=1, samples=4,
          windows=2, seed=0):
    """All four measures of one model (agreement and `recovered` need the reference)."""
    rows = {"copy": copy_recall(model, ids, samples=samples, reference=reference, seed=seed),
            "passkey": passkey(model, tokenizer, ids, lengths=passkey_lengths, depths=depths,
                               trials=trials, seed=seed),
            "perplexity": perplexity(model, ids, lengths=lengths, windows=windows)}
    if reference is not None:
        rows["agreement"] = agreement(model, reference, ids, length=lengths[0],
                                      windows=windows)
    return rows


def table(results, reference=None):
    """A markdown table of {name: suite rows}: copy recall (recovered), passkey per length
    (accuracy, and in brackets the loss of the key's digits after the first token, nats),
    perplexity per length (and as a ratio to `reference`'s, a name in results), agreement."""
    names = list(results)
    first = results[names[0]]
    ppl_lengths = list(first["perplexity"])
    key_lengths = list(first["passkey"]["overall"])
    head = (["model", "copy: recovered", "copy: 2nd reading (nats)"]
            + [f"passkey {n}" for n in key_lengths] + [f"ppl {n}" for n in ppl_lengths]
            + ["agreement"])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    base = results.get(reference) if reference else None
    for name in names:
        r = results[name]
        cells = [name, f"{r['copy'].get('recovered', float('nan')):.0%}",
                 f"{r['copy']['second']:.2f}"]
        for n in key_lengths:
            rest = r["passkey"].get("nats", {}).get(n, {}).get("rest")
            cells.append(f"{r['passkey']['overall'][n]:.0%}"
                         + (f" ({rest:.2f})" if rest is not None else ""))
        for n in ppl_lengths:
            p = r["perplexity"][n]
            cells.append(f"{p:.2f}" if base is None or base is r
                         else f"{p / base['perplexity'][n]:.3f}x")
        cells.append(f"{r['agreement']:.1%}" if "agreement" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    import transformers
    from . import pretrained
    p = argparse.ArgumentParser(prog="python -m favor.hf.longrange",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a transformers directory, or favor's full "
                   "save; with --adapter, the original (the base and the reference)")
    p.add_argument("--adapter", help="favor's compact adapter, loaded on --model")
    p.add_argument("--reference", help="the original, for a full save given as --model")
    p.add_argument("--gguf", help="a GGUF file inside --model (transformers' gguf_file)")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--passkey-lengths", default="1024,4096")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        load = {"gguf_file": args.gguf} if args.gguf else {}
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model, **load)
        plain = lambda path: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
            path, **load).eval()
        config = transformers.AutoConfig.from_pretrained(args.model, **load)
        if getattr(config, "favor", None):  # favor's full save: its converted model
            model = pretrained.from_pretrained(args.model)
            reference = plain(args.reference) if args.reference else None
        else:
            reference = plain(args.model)
            model = reference
            if args.adapter:
                import copy
                model = pretrained.from_pretrained(args.adapter, base=copy.deepcopy(reference))
            elif args.reference:
                reference = plain(args.reference)
            else:
                reference = None
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        print(f"favor.hf.longrange: {ids.numel()} tokens of {args.text}, seed {args.seed}",
              flush=True)
        ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
        rows = suite(model, tokenizer, ids, reference=reference,
                     lengths=ints(args.lengths), passkey_lengths=ints(args.passkey_lengths),
                     trials=args.trials, samples=args.samples, seed=args.seed)
    except (_core.Error, OSError, ValueError) as e:
        print(f"favor.hf.longrange: {e}", file=sys.stderr)
        return 2
    print(table({args.adapter or args.model: rows}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
