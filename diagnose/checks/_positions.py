"""Positions: does any positional information reach the model?

The probe permutes positions 1..T-1 of real rows (position 0 stays, so a BOS/CLS token or
first-token pooling is not mistaken for position information) and compares outputs in one
batched forward. If per-position outputs merely permute with the input (permutation
equivariance) or pooled outputs do not change at all (invariance), the model sees a bag of
tokens: word order cannot matter to it. A causal mask is itself a source of order (each
position sees a different prefix; Haviv et al. 2022), so causal models without position
embeddings are, correctly, not flagged.
"""

from __future__ import annotations

import torch

from ..modes import eval_mode
from ._subject import SAME, Subject, forward, in_float64, own_precision_note, token_level
from ._finding import Finding

NAME = "positions"
N_PERMUTATIONS = 3
# Relative difference below which outputs count as merely permuted. In float64 the rounding
# noise is ~1e-15 while the weakest real position signal measured (fresh model, sinusoidal
# positions, first-token pooling, nearly uniform attention) is ~1e-4; in float32 (models too
# big to copy) the noise is ~1e-6 and SAME applies.
SAME_FLOAT64 = 1e-9

_FIX = ("Add positional information: learned or sinusoidal position embeddings added to the token "
        "embeddings (x = tok_emb(ids) + pos_emb(arange(T))), or rotary embeddings applied to q and k in every "
        "attention layer. Without them self-attention is permutation-equivariant and cannot use word order.")


def check_positions(subject: Subject) -> list[Finding]:
    """Findings of the permutation test (per-position: equivariance; pooled: invariance)."""
    ids = subject.rows  # [B, T]
    B, T = ids.shape
    g = subject.generator(3)
    perms = []
    for _ in range(N_PERMUTATIONS):
        rest = torch.randperm(T - 1, generator=g) + 1
        while T > 2 and bool((rest == torch.arange(1, T)).all()):
            rest = torch.randperm(T - 1, generator=g) + 1
        perms.append(torch.cat([torch.zeros(1, dtype=torch.long), rest]))  # [T], position 0 fixed
    def run(model, _float64: bool) -> torch.Tensor:
        with eval_mode(model), torch.no_grad():
            return forward(model, subject.info, torch.cat([ids] + [ids[:, p] for p in perms]))

    out, own = in_float64(subject.model, run)
    threshold = SAME if own else SAME_FLOAT64
    note = [own_precision_note(NAME, own)] if own else []
    clean = out[:B]
    per_token = token_level(clean, ids)
    scale = clean.std().clamp_min(1e-12)
    diffs = []
    for i, p in enumerate(perms):
        changed = out[(i + 1) * B:(i + 2) * B]  # [B, T, V] or [B, C]
        expected = clean[:, p] if per_token else clean  # equivariance / invariance
        diffs.append(float((changed - expected).abs().max() / scale))
    diff = max(diffs)
    if diff > threshold:
        return note
    kind = "merely permute with the input" if per_token else "do not change"
    return note + [Finding(NAME, "warning", f"No positional information: outputs {kind} when the tokens are permuted",
                    {"max_relative_difference": diff, "permutations": N_PERMUTATIONS, "positions_permuted": T - 1,
                     "threshold": threshold, "per_position_outputs": per_token}, _FIX)]
