"""Hand-wired two-layer attention-only reference models whose circuit is known (Elhage et al. 2021).

Sequences [BOS, a, b, c, d, e, a, b, c, d, e]: five distinct tokens of 1..6, then the same five again.
The residual stream is made of +/- pairs of dimensions (so every LayerNorm's mean is 0), a large
constant pair keeping each LayerNorm's sigma nearly fixed, then one pair per token (TOK), per position
(POS), per previous token (PREV, written by L0.H0) and per output token (OUT, written by L1.H0, the only
subspace the unembedding reads). L0.H1 and L1.H1 are idle (all weights 0), MLPs are 0.

- L0.H0, the previous-token head: query POS t, key POS t + 1 (attends to t - 1), value TOK, writes PREV.
- L1.H0 reads, by `kind`:
  - "induction" (K-composition): query TOK, key PREV, value TOK: attends to the token after the earlier
    copy of the current one and writes it to OUT; scored on the second half's next tokens.
  - "q" (Q-composition): query PREV, key TOK: attends where the previous token sits, value TOK: the
    previous token; scored on every position from 1.
  - "v" (V-composition): query and key POS (attends to itself), value PREV: the previous token.
  - "backup": "induction", and L1.H1 a second induction head writing BACKUP times as much: with L1.H0 gone
    the logits' margin falls from 1.4 GAIN to 0.4 GAIN, still right, so L1.H0's edges cost little alone
    and everything inside a circuit without L1.H1 (the self-repair gap).
  - "relay": "induction", but L1.H0 writes RELAY, which the unembedding does not read, and layer 1's MLP
    relays it: hidden unit t fires (GELU past a threshold) where RELAY t is written, and writes OUT t.
So the circuit is exactly {L0.H0 -> L1.H0 (k | q | v), L1.H0 -> output}; every other edge is 0 (but
L1.H1's, in "backup"); in "relay" it is {L0.H0 -> L1.H0 (k), L1.H0 -> MLP1, MLP1 -> output}.
"""

from __future__ import annotations

import torch

from diagnose.zoo import ModelConfig, Transformer

V, HALF = 7, 5  # token 0 is BOS
T = 1 + 2 * HALF
BIG, SHARP, GAIN, BACKUP = 30.0, 40.0, 12.0, 0.4
PAIRS = {"C": 1, "TOK": V, "POS": T, "PREV": V, "OUT": V, "RELAY": V}
D_MODEL = 2 * sum(PAIRS.values())  # 80
FIRE, THRESHOLD = 4.0, 2.0  # the relay's hidden unit: GELU(FIRE * RELAY_t - THRESHOLD)


def pair(space: str, i: int = 0) -> int:
    """The first dimension of pair i of `space`."""
    start = 0
    for name, n in PAIRS.items():
        if name == space:
            return 2 * (start + i)
        start += n
    raise KeyError(space)


def _write(w: torch.Tensor, row: int, space: str, i: int, value: float) -> None:
    """Weight rows of a map writing `value` onto pair i of `space` from input column `row`."""
    d = pair(space, i)
    w[d, row], w[d + 1, row] = value, -value


def _read(w: torch.Tensor, row: int, space: str, i: int, value: float) -> None:
    """Row `row` of a map reading pair i of `space` (the pair's (+, -) halves, so it reads a +1 as value)."""
    d = pair(space, i)
    w[row, d], w[row, d + 1] = value / 2, -value / 2


def planted(kind: str = "induction") -> Transformer:
    cfg = ModelConfig(vocab_size=V, max_len=T, n_layers=2, n_heads=2, d_model=D_MODEL, positions="learned")
    model = Transformer(cfg)
    D = cfg.head_dim
    sigma = BIG * (2 / D_MODEL) ** 0.5  # each LayerNorm divides by about this
    q_of, k_of, v_of = 0, 2 * D, 4 * D  # head 0's rows of qkv: [q; k; v], each H * D rows
    sharp = SHARP * D ** 0.5 * sigma  # a matching query-key pair scores SHARP after 1 / sqrt(D)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in (*(b.ln1 for b in model.blocks), *(b.ln2 for b in model.blocks), model.ln_f):
            ln.weight.fill_(1.0)
        model.tok_emb.weight[:, pair("C")], model.tok_emb.weight[:, pair("C") + 1] = BIG, -BIG
        for t in range(V):
            _write(model.tok_emb.weight.T, t, "TOK", t, 1.0)
        for t in range(T):
            _write(model.pos_emb.weight.T, t, "POS", t, 1.0)
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for t in range(T - 1):
            _read(a0.qkv.weight, q_of + t, "POS", t + 1, sharp / sigma)
            _read(a0.qkv.weight, k_of + t, "POS", t, sigma)
        for t in range(V):
            _read(a0.qkv.weight, v_of + t, "TOK", t, sigma)
            _write(a0.proj.weight, t, "PREV", t, 1.0)
        q_space, k_space, v_space = {"induction": ("TOK", "PREV", "TOK"), "q": ("PREV", "TOK", "TOK"),
                                     "v": ("POS", "POS", "PREV"), "backup": ("TOK", "PREV", "TOK"),
                                     "relay": ("TOK", "PREV", "TOK")}[kind]
        for head, gain in ((0, 1.0), (1, BACKUP)) if kind == "backup" else ((0, 1.0),):
            for i in range(T if q_space == "POS" else V):
                _read(a1.qkv.weight, q_of + head * D + i, q_space, i, sharp / sigma)
                _read(a1.qkv.weight, k_of + head * D + i, k_space, i, sigma)
            for t in range(V):
                _read(a1.qkv.weight, v_of + head * D + t, v_space, t, sigma)
                _write(a1.proj.weight, head * D + t, "RELAY" if kind == "relay" else "OUT", t, gain)
        if kind == "relay":
            _relay(model.blocks[1].mlp, sigma)
        for t in range(V):
            _read(model.head.weight, t, "OUT", t, GAIN * sigma)
    return model.eval()


def _relay(mlp, sigma: float) -> None:
    """Hidden unit t: GELU(FIRE * RELAY_t - THRESHOLD), written onto OUT t scaled (and offset by the proj's
    bias) so that it writes 1 where RELAY_t is 1 and 0 where it is 0: a thresholded, not a linear, relay."""
    gelu = torch.nn.functional.gelu
    on, off = (float(gelu(torch.tensor(x))) for x in (FIRE - THRESHOLD, -THRESHOLD))
    for t in range(V):
        _read(mlp.fc.weight, t, "RELAY", t, FIRE * sigma)
        mlp.fc.bias[t] = -THRESHOLD
        _write(mlp.proj.weight, t, "OUT", t, 1 / (on - off))
        _write(mlp.proj.bias[:, None], 0, "OUT", t, -off / (on - off))


def planted_data(kind: str = "induction", n: int = 40, seed: int = 0, wrong: bool = False) -> dict[str, torch.Tensor]:
    """n sequences and their labels: the next token of the second half (induction), else the previous token;
    wrong: with wrong_labels, the current token as each unit's wrong answer (the logit difference metric)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randperm(V - 1, generator=g)[:HALF] + 1 for _ in range(n)])  # [N, HALF]
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), first, first], dim=1)  # [N, T]
    labels = torch.full_like(ids, -100)
    if kind in ("induction", "backup", "relay"):
        labels[:, HALF + 1:-1] = ids[:, HALF + 2:]
    else:
        labels[:, 1:] = ids[:, :-1]
    out = {"input_ids": ids, "labels": labels}
    if wrong:
        out["wrong_labels"] = torch.where(labels == -100, labels, ids)
    return out
