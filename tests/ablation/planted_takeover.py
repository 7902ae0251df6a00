"""A hand-written 2-layer model (tests/nano.py's nanoGPT-style code, no adapter) whose layer-0 head
carries the task and whose layer-1 head takes over when it is removed.

d_model 8, four heads of width 2 per layer, no mask, mean pooling; tokens 1 (label 1) and 2 (label 0)
at position 0, filler 3 after. Directions, each a +/- pair of dimensions so that every LayerNorm's mean
is 0: dims 0/1 a large constant (every LayerNorm's sigma barely moves), 2/3 the sign s of the first
token, 4/5 the feature f the classifier reads, 6/7 a marker m on the first token.

- L0.H0 (the writer): query 1, key G m: nearly all its attention on the first token (a striking map);
  value s, written onto f: f = s everywhere.
- L1.H0 (the backup): the same map; value s - f, written onto f: nothing when the writer did its job,
  s when the writer is gone. The final f is s either way.
- every other head and both MLPs: all weights zero. The classifier reads f only.

So the writer's total effect is about 0, and its direct effect (f on the direct path only, the
backup frozen at its clean output, which is about 0) is the whole margin: loss log 2 against a clean
loss near 0. Removing the backup changes nothing, directly or not.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..nano import NanoGPT

T, BIG, G, MARGIN = 4, 30.0, 30.0, 3.0
SIGMA = BIG / 2  # a LayerNorm's sigma over 8 dims of (BIG, -BIG, small ...): sqrt(2 * BIG^2 / 8), nearly


def _read(row: torch.Tensor, i: int, gain: float) -> None:
    """row reads the pair (dim i, dim i + 1) of a LayerNorm's output: gain * (x_i - x_{i+1}) / 2 * sigma."""
    row[i], row[i + 1] = 0.5 * gain * SIGMA, -0.5 * gain * SIGMA


def planted_takeover() -> NanoGPT:
    model = NanoGPT(vocab=4, d=8, n_heads=4, n_layers=2, max_len=T, mask_offset=None, positions=False, pooled=2)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for block in model.h:
            block.ln_1.weight.fill_(1.0)
            block.ln_2.weight.fill_(1.0)
        model.ln_f.weight.fill_(1.0)
        emb = model.wte.weight  # [V, d]
        emb[:, 0], emb[:, 1] = BIG, -BIG
        for token, s in ((1, 1.0), (2, -1.0)):
            emb[token, 2], emb[token, 3] = s, -s
            emb[token, 6], emb[token, 7] = 1.0, -1.0  # the first-token marker m
        for layer, block in enumerate(model.h):
            w = block.attn.c_attn.weight  # [3d, d]: q, k, v rows; head 0's first unit is row 0 of each
            _read(w[0], 0, 1 / BIG)  # query 1 (dims 0/1 are BIG / sigma after ln_1)
            _read(w[8], 6, G)  # key G m
            _read(w[16], 2, 1.0)  # value s ...
            if layer == 1:
                _read(w[16], 4, -1.0)  # ... - f (the backup)
            proj = block.attn.c_proj.weight  # [d, d]: head 0's first unit onto f
            proj[4, 0], proj[5, 0] = 1.0, -1.0
        _read(model.lm_head.weight[1], 4, MARGIN)  # logits (-MARGIN f, +MARGIN f)
        model.lm_head.weight[0] = -model.lm_head.weight[1]
    return model.eval()


def takeover_data(n: int = 48) -> dict[str, torch.Tensor]:
    """Half label 1 (token 1 first), half label 0 (token 2 first), filler 3 after."""
    labels = torch.arange(n) % 2  # [N]
    ids = torch.full((n, T), 3)
    ids[:, 0] = torch.where(labels == 1, 1, 2)
    return {"input_ids": ids, "attention_mask": torch.ones(n, T, dtype=torch.long), "labels": labels}


class OddRMSNorm(nn.Module):
    """An RMSNorm keeping its gain under a name diagnose does not guess (`alpha`): no known form fits it."""

    def __init__(self, d: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((d,), 1.5))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.alpha


def with_unknown_norm() -> NanoGPT:
    """The same model with a final norm whose frozen form nothing declares (its direct effects cannot be had)."""
    model = planted_takeover()
    model.ln_f = OddRMSNorm(8)
    return model.eval()
