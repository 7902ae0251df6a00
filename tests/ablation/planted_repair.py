"""A hand-built model whose one head is compensated: removing it changes nothing, yet the output reads it.

One pre-norm layer, d_model 8, two heads, pooling on the first position, tokens 1 (label 1) and 2
(label 0) at position 0, filler 3 elsewhere. Directions, each a +/- pair of dimensions so that the
LayerNorms' mean is 0: dims 0/1 a large constant (so every LayerNorm's sigma barely moves), 2/3 the
sign s of the first token (+1 or -1), 4/5 the feature f the classifier reads.

- L0.H0 (the writer): uniform attention, value s, projected onto f with gain T: f = s everywhere.
- L0.H1: all weights zero (idle).
- the MLP (the repair): GELU(a) - GELU(-a) = a exactly, so it adds (s - f) onto f: nothing when the
  writer did its job, s when the writer is gone. The final f is s either way.
- the classifier reads f only.

So the writer's total effect is about 0 and its direct effect (f on the direct path only: 0) is the
whole margin: loss log 2 against a clean loss near 0.
"""

from __future__ import annotations

import torch

from diagnose.zoo import ModelConfig, Transformer

T, BIG, MARGIN = 4, 30.0, 3.0


def _pair(w: torch.Tensor, i: int) -> torch.Tensor:
    """The unit of direction (dim i, dim i + 1) as (+1, -1) / 2 read off a row vector."""
    w.zero_()
    w[i], w[i + 1] = 0.5, -0.5
    return w


def planted_repair() -> Transformer:
    cfg = ModelConfig(kind="classifier", vocab_size=4, n_classes=2, max_len=T, n_layers=1, n_heads=2, d_model=8,
                      d_ff=2, pooling="first", positions="none", dropout=0.0)
    model = Transformer(cfg)
    sigma = BIG / 2  # LayerNorm's sigma of (BIG, -BIG, +-1, -+1, ...) over 8 dims: sqrt(2 * BIG^2 / 8), nearly
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in (model.blocks[0].ln1, model.blocks[0].ln2, model.ln_f):
            ln.weight.fill_(1.0)
        emb = model.tok_emb.weight  # [V, d]
        emb[:, 0], emb[:, 1] = BIG, -BIG
        emb[1, 2], emb[1, 3] = 1.0, -1.0  # s = +1
        emb[2, 2], emb[2, 3] = -1.0, 1.0  # s = -1
        attn = model.blocks[0].attn
        D = attn.head_dim
        v0 = 2 * D * 2  # the qkv row of head 0's first value unit ([q; k; v], each H * D rows)
        _pair(attn.qkv.weight[v0], 2).mul_(sigma)  # value = s (ln1 divides by sigma)
        attn.proj.weight[4, 0], attn.proj.weight[5, 0] = T, -T  # the mean over T positions times T: f = s
        mlp = model.blocks[0].mlp
        row = torch.zeros(8)
        row[2], row[3], row[4], row[5] = 0.5, -0.5, -0.5, 0.5  # s - f
        mlp.fc.weight[0] = row * sigma
        mlp.fc.weight[1] = -row * sigma
        mlp.proj.weight[4], mlp.proj.weight[5] = torch.tensor([1.0, -1.0]), torch.tensor([-1.0, 1.0])
        head = model.head.weight  # [2, d]: logits (-k f, +k f)
        _pair(head[1], 4).mul_(2 * MARGIN * sigma)
        head[0] = -head[1]
    return model.eval()


def planted_data(n: int = 48) -> dict[str, torch.Tensor]:
    """Half label 1 (token 1 first), half label 0 (token 2 first), filler 3 after."""
    labels = torch.arange(n) % 2  # [N]
    ids = torch.full((n, T), 3)
    ids[:, 0] = torch.where(labels == 1, 1, 2)
    return {"input_ids": ids, "attention_mask": torch.ones(n, T, dtype=torch.long), "labels": labels}
