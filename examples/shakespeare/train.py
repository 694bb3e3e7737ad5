"""Train a character-level transformer on tinyshakespeare with favor's attention layers.

    python examples/shakespeare/train.py --out runs/exact.pt
    ... --resume --out runs/exact.pt                       # continue an interrupted run
    ... --attention favorsharp-256 --init runs/exact.pt --steps 360 --out runs/ft.pt
                                                           # convert the baseline, fine-tune
    ... --attention '{"method": "favor", "kernel": "hedgehog", "features": 64,
                      "learn_features": true}' ...
    ... --out runs/exact.pt --quick                        # a smoke test: 2 steps of batch 4

The model is favor.models.CharTransformer (preset --model, default 'shakespeare'); the loop,
schedule and checkpoints are favor.models.training. A progress line goes to stderr; each
--eval-every steps the validation bits per character go to stdout, and a checkpoint (model
config, weights, optimizer, step, RNG states) is written atomically to --out.
"""
import argparse
import os
import sys
import time

import torch

from common import DATA, QUICK, add_quick, calibration, fit_options, setup
from favor.models import CharData, bits_per_char
from favor.models.conversion import convert_method
from favor.models.char_transformer import CharTransformer
from favor.models.training import (MODEL_PRESETS, TrainConfig, Trainer, attention_preset,
                                   load_model)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--out", required=True, help="checkpoint path (written every --eval-every)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--init", help="start from this checkpoint's weights, converted to "
                   "--attention when given (favor.models.conversion: FAVOR++/# and the learned "
                   "maps are fitted to 16 training windows first); a new optimizer, step 0")
    p.add_argument("--attention", default=None,
                   help="exact (default), favor-orth-M, favor-iid-M, trig-orth-M, hedgehog-M, "
                        "vq-C or a JSON spec of FavorAttention keywords; with --init also "
                        "favorpp-M, favorsharp-M, positive-fit-M, wpff-M (fitted; hedgehog-M "
                        "is then fitted too)")
    p.add_argument("--model", default="shakespeare", choices=sorted(MODEL_PRESETS))
    d = TrainConfig()
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--min-lr", type=float, default=None, help="default lr / 10")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-windows", type=int, default=d.eval_windows)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 2; --quick: 1)")
    p.add_argument("--data", default=DATA)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop (with a checkpoint) after this much wall time")
    add_quick(p, f"at most {QUICK['steps']} steps (--resume: {QUICK['steps']} more) of batch "
              f"{QUICK['batch']}, {QUICK['windows']} validation windows; --init --attention "
              f"fitted on {QUICK['calibration']} windows, {QUICK['fit_steps']} steps per "
              "learned-map fit")
    a = p.parse_args(argv)
    setup(a.threads, a.quick)
    if a.quick:
        a.steps, a.batch = min(a.steps, QUICK["steps"]), min(a.batch, QUICK["batch"])
        a.eval_windows = min(a.eval_windows, QUICK["windows"])
        a.eval_every = min(a.eval_every, a.steps)
    data = CharData.from_file(a.data)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    if a.resume:
        t = Trainer.resume(a.out, data)
        print(f"resumed {a.out} at step {t.step}/{t.config.steps} (seed {t.seed})", flush=True)
    else:
        torch.manual_seed(a.seed)
        config = TrainConfig(steps=a.steps, batch=a.batch, lr=a.lr, warmup=a.warmup,
                             min_lr=a.lr / 10 if a.min_lr is None else a.min_lr,
                             eval_every=a.eval_every, eval_windows=a.eval_windows,
                             checkpoint_every=a.eval_every)
        info = None
        if a.init:
            model, _ = load_model(a.init)
            if a.attention:
                calib = calibration(data, model.context, a.seed, a.quick)
                model, info = convert_method(model, a.attention, calib, seed=a.seed,
                                             verbose=True, **fit_options(a.quick))
        else:
            spec = attention_preset(a.attention) if a.attention else None
            model = CharTransformer(vocab=data.vocab, attention=spec, **MODEL_PRESETS[a.model])
        t = Trainer(model, data, config, seed=a.seed,
                    extra=dict(init=a.init, attention=a.attention, conversion=info))
        print(f"seed {a.seed} (model init torch.manual_seed({a.seed}), data generator "
              f"{a.seed + 1}); torch threads {torch.get_num_threads()}", flush=True)
    m, c = t.model, t.config
    # --quick after --resume: a few more steps and windows, the run's own config kept
    stop = min(c.steps, t.step + QUICK["steps"]) if a.quick else c.steps
    windows = min(c.eval_windows, QUICK["windows"]) if a.quick else c.eval_windows
    print(f"model {m.config}; {m.num_parameters()} parameters", flush=True)
    print(f"train {c}", flush=True)
    if t.step == 0:
        print(f"step 0 val_bpc {bits_per_char(m, data, 'val', count=windows):.4f}",
              flush=True)

    start, first = time.time(), t.step
    loss_avg = None
    while t.step < stop:
        loss = t.train_step()
        loss_avg = loss if loss_avg is None else 0.95 * loss_avg + 0.05 * loss
        el = time.time() - start
        per = el / (t.step - first)
        sys.stderr.write(f"\rstep {t.step}/{c.steps} loss {loss_avg:.3f} "
                         f"({loss_avg / 0.6931:.3f} bpc) {per:.2f} s/step "
                         f"eta {per * (c.steps - t.step) / 60:.1f} min ")
        sys.stderr.flush()
        out_of_time = a.max_minutes is not None and el > 60 * a.max_minutes
        if t.step % c.eval_every == 0 or t.step == stop or out_of_time:
            bpc = bits_per_char(m, data, "val", count=windows)
            sys.stderr.write("\n")
            print(f"step {t.step} train_loss {loss_avg:.4f} val_bpc {bpc:.4f} "
                  f"elapsed {el:.0f} s ({per:.3f} s/step)", flush=True)
            t.save(a.out)
        if out_of_time:
            print(f"stopped after {a.max_minutes} min at step {t.step}; --resume continues",
                  flush=True)
            break


if __name__ == "__main__":
    main()
