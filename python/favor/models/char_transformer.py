"""A small decoder-only character-level transformer whose attention layers are favor's.

    model = CharTransformer(vocab=65, d_model=128, heads=4, layers=4, context=256)
    logits = model(ids)                                     # [B, N] -> [B, N, vocab]
    ids = model.generate(prompt_ids, 200, temperature=0.8, top_k=None, seed=0)
    fav = convert_attention(model, method="favor", kernel="positive", features=256)

The attention of every layer is built from an attention spec: a dict of keyword arguments of
favor.torch.FavorAttention (causal is always True), e.g.

    {"method": "exact"}                                            the baseline (softmax)
    {"method": "favor", "kernel": "positive", "features": 256, "projection": "orthogonal"}
    {"method": "favor", "kernel": "favorpp", "features": 64, "fit": 0.1}   FAVOR++ (A)
    {"method": "favor", "kernel": "hedgehog", "features": 64, "learn_features": True}
    {"method": "favor", "features": 64, "feature_weights": True, "decay": 0.99}
    {"method": "vq", "codes": 256, ...}        favor.torch.VQAttention (its keywords)

Layer i uses seed spec.get("seed", 0) + 1000 i, so the layers draw independent features.
Generation streams tokens through favor's decoders (FavorAttention/VQAttention.decoder and
step: a fixed-size state per layer) and, for method="exact", through a key-value cache
written here in plain torch. Positions are sinusoidal by default (positions="sinusoidal"), so a
model trained on `context` tokens can run at any position: generation streams on without
limit (favor's per-token cost stays constant; the exact KV cache grows). With learned
position embeddings (positions="learned") generation re-encodes the last context // 2 tokens
when it reaches `context` (both paths), so every logit is the full forward's over the window.
"""
import copy
import json
import math

import torch
from torch import nn
from torch.nn import functional as F

import favor.torch as ft

from .. import _core

EXACT = {"method": "exact"}


def attention_spec(spec):
    """A spec as a dict: a dict, a JSON string, or None (exact). Returns a new dict."""
    if spec is None:
        return dict(EXACT)
    if isinstance(spec, str):
        spec = json.loads(spec)
    if not isinstance(spec, dict):
        raise _core.Error(f"attention: {spec!r} must be a dict of FavorAttention keywords "
                          "(or VQAttention's with method='vq')")
    spec = dict(spec)
    if "causal" in spec:
        raise _core.Error("attention: causal is always True in CharTransformer; leave it out")
    spec.setdefault("method", "exact")
    return spec


def make_attention(d_model, heads, spec, layer=0):
    """The attention module of layer `layer` for a spec (see the module docstring)."""
    spec = attention_spec(spec)
    method = spec.pop("method")
    seed = int(spec.pop("seed", 0)) + 1000 * layer
    if method == "vq":
        if "codes" not in spec:
            raise _core.Error("attention: method='vq' needs codes (the codebook size)")
        codes = spec.pop("codes")
        return ft.VQAttention(d_model, heads, codes, causal=True, seed=seed, **spec)
    return ft.FavorAttention(d_model, heads, causal=True, method=method, seed=seed, **spec)


class Block(nn.Module):
    """Pre-LayerNorm block: x + drop(attn(LN(x))), then x + drop(MLP(LN(x)))."""

    def __init__(self, d_model, heads, spec, layer, dropout):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = make_attention(d_model, heads, spec, layer)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


def sinusoids(start, n, d, rms=0.02):
    """The sinusoidal position encodings of positions start .. start + n - 1: [n, d]
    (sin on even, cos on odd dimensions, wavelengths 2 pi .. 10000 2 pi), scaled to root mean
    square `rms`: the scale of the token embeddings at initialisation (std 0.02), so that
    positions do not drown the tokens (at unit scale they slowed training: 4.13 against 3.6
    validation bpc after 250 and 100 steps of the baseline)."""
    pos = torch.arange(start, start + n, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    out = torch.zeros(n, d, dtype=torch.float64)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return (out * (rms * math.sqrt(2.0))).float()


class CharTransformer(nn.Module):
    """Token embeddings + sinusoidal (or learned) positions, `layers` pre-LN blocks with causal self-attention
    (built from `attention`, a spec dict or JSON string), a final LayerNorm and an output
    head (tied to the token embedding with tie=True).

    CharTransformer(vocab, d_model, heads, layers, context, attention=None, dropout=0.0,
                    tie=True, positions="sinusoidal")
    forward(ids [B, N]) -> logits [B, N, vocab] (any N with sinusoidal positions; N <= context
    with learned ones; training uses windows of `context`). aux_loss(): the VQ
    commitment losses of the latest forward (0 for other methods). `config` holds the
    constructor's arguments (JSON-able): CharTransformer(**config) rebuilds the model.
    """

    def __init__(self, vocab, d_model, heads, layers, context, attention=None, dropout=0.0,
                 tie=True, positions="sinusoidal"):
        super().__init__()
        spec = attention_spec(attention)
        if positions not in ("sinusoidal", "learned"):
            raise _core.Error(f"positions: '{positions}' must be sinusoidal or learned")
        self.config = dict(vocab=vocab, d_model=d_model, heads=heads, layers=layers,
                           context=context, attention=spec, dropout=dropout, tie=tie,
                           positions=positions)
        self.context = context
        self.positions = positions
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model) if positions == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, heads, spec, i, dropout)
                                    for i in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.apply(self._init_weights)
        if tie:
            self.head.weight = self.tok.weight

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def spec(self):
        return dict(self.config["attention"])

    @property
    def method(self):
        return self.config["attention"]["method"]

    def attentions(self):
        return [b.attn for b in self.blocks]

    def _embed(self, ids, start=0):
        n = ids.shape[1]
        if self.pos is None:
            return self.drop(self.tok(ids) + sinusoids(start, n, self.config["d_model"]))
        if start + n > self.context:
            raise _core.Error(f"ids: positions {start}..{start + n - 1} go past the context "
                              f"({self.context} learned positions)")
        return self.drop(self.tok(ids) + self.pos(torch.arange(start, start + n)))

    def _logits(self, x):
        return self.head(self.norm(x))

    def forward(self, ids):
        x = self._embed(ids)
        for block in self.blocks:
            x = block(x)
        return self._logits(x)

    def aux_loss(self):
        """Sum of the VQ layers' commitment losses of the latest forward (0.0 if none)."""
        losses = [a.commitment_loss for a in self.attentions()
                  if getattr(a, "commitment_loss", None) is not None]
        return sum(losses) if losses else torch.zeros(())

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ generation

    def _start(self, batch):
        """Per-layer streaming state: favor's decoders, or empty key-value caches (exact)."""
        if self.method == "exact":
            return [None] * len(self.blocks)
        return [b.attn.decoder(batch) for b in self.blocks]

    def _exact_step(self, attn, x, cache):
        """Causal softmax attention of new tokens x [B, T, E] (a prompt when the cache is
        empty, else T = 1) against the cache of earlier keys and values: plain torch. The
        cache (keys, values, length) preallocates its buffers and doubles them when full, so
        appending a token costs O(1) amortised and a step reads the keys once."""
        q, k, v = attn._heads(attn.q_proj(x)), attn._heads(attn.k_proj(x)), attn._heads(attn.v_proj(x))
        t = q.shape[2]
        if cache is None:
            cap = max(64, 2 * t)
            kb = k.new_empty(k.shape[:2] + (cap, k.shape[3]))
            vb = v.new_empty(v.shape[:2] + (cap, v.shape[3]))
            n0 = 0
        else:
            kb, vb, n0 = cache
            if n0 + t > kb.shape[2]:
                cap = 2 * (n0 + t)
                kb = torch.cat([kb[:, :, :n0], kb.new_empty(kb.shape[:2] + (cap - n0, kb.shape[3]))], 2)
                vb = torch.cat([vb[:, :, :n0], vb.new_empty(vb.shape[:2] + (cap - n0, vb.shape[3]))], 2)
        kb[:, :, n0:n0 + t] = k
        vb[:, :, n0:n0 + t] = v
        n = n0 + t
        scale = attn.scale if attn.scale is not None else attn.head_dim ** -0.5
        s = torch.matmul(q, kb[:, :, :n].transpose(-1, -2)) * scale        # [B, H, T, n]
        if t > 1:
            future = torch.ones(t, n, dtype=torch.bool).triu(n - t + 1)
            s = s.masked_fill(future, float("-inf"))
        y = torch.matmul(torch.softmax(s, dim=-1), vb[:, :, :n])
        return attn.out_proj(attn._merge(y)), (kb, vb, n)

    @torch.no_grad()
    def _step(self, ids, state, position):
        """Logits [B, T, vocab] of new tokens ids [B, T] at positions position.. given the
        streaming state (updated in place)."""
        x = self._embed(ids, position)
        for i, block in enumerate(self.blocks):
            h = block.norm1(x)
            if self.method == "exact":
                a, state[i] = self._exact_step(block.attn, h, state[i])
            else:
                a = block.attn.step(h, state[i])
            x = x + a
            x = x + block.mlp(block.norm2(x))
        return self._logits(x)

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperature=1.0, top_k=None, seed=0,
                 return_logits=False):
        """Continue prompt_ids ([P] or [B, P] int tensor/list, P >= 1) by n tokens, streamed:
        the prompt is prefilled once, then one token per step. temperature 0 is greedy
        (argmax); top_k keeps the k likeliest tokens; sampling uses a torch.Generator
        seeded with `seed`, so a seed repeats. Returns the ids [B, P + n] ([P + n] for a 1-D
        prompt), and with return_logits=True also the logits [B, n, vocab] each token was
        drawn from. Runs in eval mode (restored afterwards)."""
        ids = torch.as_tensor(prompt_ids, dtype=torch.long)
        one = ids.dim() == 1
        ids = ids[None] if one else ids
        if ids.dim() != 2 or ids.shape[1] < 1:
            raise _core.Error(f"prompt_ids: shape {list(ids.shape)} must be [P] or [B, P], P >= 1")
        was_training = self.training
        self.eval()
        g = torch.Generator().manual_seed(int(seed))
        keep = max(1, self.context // 2)
        learned = self.pos is not None
        window = ids[:, -self.context:] if learned else ids
        state = self._start(ids.shape[0])
        logits = self._step(window, state, 0)[:, -1]
        position = window.shape[1]
        out, steps = [ids], []
        for i in range(n):
            steps.append(logits)
            nxt = self._sample(logits, temperature, top_k, g)
            out.append(nxt)
            if i == n - 1:
                break
            if learned and position == self.context:  # re-encode the last context // 2
                window = torch.cat(out, dim=1)[:, -keep:]
                state = self._start(ids.shape[0])
                logits = self._step(window, state, 0)[:, -1]
                position = window.shape[1]
            else:
                logits = self._step(nxt, state, position)[:, -1]
                position += 1
        self.train(was_training)
        result = torch.cat(out, dim=1)
        result = result[0] if one else result
        if return_logits:
            lg = torch.stack(steps, dim=1) if steps else torch.zeros(ids.shape[0], 0, self.config["vocab"])
            return result, (lg[0] if one else lg)
        return result

    @staticmethod
    def _sample(logits, temperature, top_k, generator):
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def convert_attention(model, calibration=None, layer_kwargs=None, **spec):
    """A copy of `model` with every attention layer replaced by one built from `spec`
    (FavorAttention keywords, or method='vq' with VQAttention's), keeping the trained
    q/k/v/out projections and everything else; the copy's config records the new spec and
    it keeps the model's train/eval mode. VQ codebooks are initialised by k-means on the
    keys of `calibration` (ids [B, N] from the training split) when given, else by the
    copy's first forward. layer_kwargs: one dict per layer of further keywords for that
    layer only (a fitted `fit` or `feature_init`; favor.models.conversion), which the
    config does not record."""
    spec = attention_spec(spec)
    if layer_kwargs is not None and len(layer_kwargs) != len(model.blocks):
        raise _core.Error(f"layer_kwargs: has {len(layer_kwargs)} entries; the model has "
                          f"{len(model.blocks)} layers")
    new = copy.deepcopy(model)
    new.config = dict(model.config, attention=dict(spec))
    d_model, heads = model.config["d_model"], model.config["heads"]
    for i, block in enumerate(new.blocks):
        old = block.attn
        extra = dict(spec, **layer_kwargs[i]) if layer_kwargs is not None else spec
        attn = make_attention(d_model, heads, extra, i)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(attn, name).load_state_dict(getattr(old, name).state_dict())
        attn.train(old.training)
        block.attn = attn
    if calibration is not None and spec["method"] == "vq":
        mode = new.training
        new.eval()
        with torch.no_grad():
            new(torch.as_tensor(calibration, dtype=torch.long))
        new.train(mode)
    return new


def bits(loss):
    """Nats to bits."""
    return loss / math.log(2.0)
