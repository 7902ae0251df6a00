"""Heatmap versus causal effect: rank correlations, and the heads where they disagree.

The causal effect of a head is its delta loss under ablation (positive: the model needs
it); it is finer-grained than delta accuracy, which saturates. A head is flagged
`striking_but_inert` when its attention looks decisive (most weight on one key, on the
first token, itself or the previous token) yet removing it changes nothing significant
and nothing sizeable; `diffuse_but_vital` is the reverse: spread-out attention, and a
significant, sizeable effect. Look-alike heads (one layer, the same decisive pattern) are
also closed together: `redundant_group` flags a set that each barely matters alone and
takes the answer with it together.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
from scipy.stats import spearmanr

from .result import ATTENTION_STATS, HeadEffect

EFFECT = "delta_loss"
DECISIVE = 0.6  # a pattern "looks decisive" when this share of weight goes to one key / one role
DIFFUSE = 0.35  # ... and "looks diffuse" when no key and no role gets this much
TINY_ACCURACY = 0.01  # |delta accuracy| below 1 point is tiny ...
TINY_LOSS = 0.02  # ... and so is |delta loss| below 2 % of the baseline loss (+ 0.001 nats)
VITAL_ACCURACY = 0.02  # vital: significant and at least 2 points of accuracy ...
VITAL_LOSS = 0.10  # ... or 10 % of the baseline loss
ROLE_SLACK = 0.05  # a named role's share this close to the max weight means the peak is on that role's key
_ROLES = {"max_weight": "on a single key", "first_token": "on the first token", "self": "on itself",
          "prev_token": "on the previous token"}


def spearman(x: Sequence[float | None], y: Sequence[float | None]) -> dict[str, Any]:
    """Spearman rho with its p-value over the pairs where both are known (None when undefined)."""
    pairs = [(a, b) for a, b in zip(x, y) if _known(a) and _known(b)]
    out: dict[str, Any] = {"rho": None, "p_value": None, "n": len(pairs)}
    if len(pairs) < 3:
        return out
    a, b = np.array(pairs, dtype=np.float64).T
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho, p = spearmanr(a, b)
    out["rho"], out["p_value"] = float(rho), float(p)
    return out


def correlations(heads: Sequence[HeadEffect]) -> dict[str, Any]:
    """Spearman between each attention statistic (and grad importance) and the ablation effect."""
    effect = [h.delta_loss for h in heads]
    out: dict[str, Any] = {"effect": EFFECT}
    for stat in ATTENTION_STATS:
        out[stat] = spearman([h.attention.get(stat) for h in heads], effect)
    out["grad_importance"] = spearman([h.grad_importance for h in heads], effect)
    out["grad_importance_raw"] = spearman([h.grad_importance_raw for h in heads], effect)
    out["estimated_delta_loss"] = spearman([h.estimated_delta_loss for h in heads], effect)
    return out


def flags(heads: Sequence[HeadEffect], baseline_loss: float) -> list[dict[str, Any]]:
    """Heads whose heatmap and ablation disagree, each with the reason in words."""
    out = []
    group_of = {m: members for _, members in look_alikes(heads) for m in members}
    for h in heads:
        if not h.verified:
            continue
        role, share = _dominant(h.attention)
        if role is not None and share >= DECISIVE and _tiny(h, baseline_loss) and not h.significant:
            twins = [list(m) for m in group_of.get((h.layer, h.head), []) if m != (h.layer, h.head)]
            cover = (f"; {len(twins)} other head(s) of layer {h.layer} look the same and may cover for it "
                     "(single-head ablation misses redundancy)") if twins else ""
            flag = _flag("striking_but_inert", h, f"{share:.0%} of its attention goes {_ROLES[role]}, yet removing "
                         f"it changes accuracy by {_effect(h)} and loss by {h.delta_loss:+.4f}{cover}")
            out.append({**flag, "twins": twins} if twins else flag)
        elif share is not None and share < DIFFUSE and h.significant and _vital(h, baseline_loss):
            out.append(_flag("diffuse_but_vital", h,
                             f"its attention is spread out (at most {share:.0%} on any key or role, "
                             f"entropy {h.attention.get('entropy', float('nan')):.2f} nats), yet removing it "
                             f"changes accuracy by {_effect(h)} and loss by {h.delta_loss:+.4f}"))
    return out


def look_alikes(heads: Sequence[HeadEffect]) -> list[tuple[str, list[tuple[int, int]]]]:
    """(role, heads) for each set of two or more heads of one layer whose most striking pattern is
    the same role (first token, itself, previous token, or one key), each decisive; sorted heads."""
    groups: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for h in heads:
        role, share = _dominant(h.attention)
        if role is not None and share >= DECISIVE:
            groups.setdefault((h.layer, role), []).append((h.layer, h.head))
    return [(role, sorted(members)) for (_, role), members in groups.items() if len(members) >= 2]


def redundant_flag(role: str, members: list[tuple[int, int]], heads: dict[tuple[int, int], HeadEffect],
                   together: dict[str, Any]) -> dict[str, Any] | None:
    """A `redundant_group` flag when look-alike heads that each barely matter alone take the answer
    with them when closed together; None when a member matters alone or the group costs no more."""
    hs = [heads[m] for m in members]
    if any(h.delta_accuracy is None or abs(h.delta_accuracy) >= VITAL_ACCURACY for h in hs):
        return None
    singles = sum(h.delta_accuracy for h in hs)
    if together["delta_accuracy"] - singles > -VITAL_ACCURACY:
        return None
    shares = [_dominant(h.attention)[1] for h in hs]
    names = ", ".join(f"L{h.layer}.H{h.head}" for h in hs)
    reason = (f"{names} each put {min(shares):.0%} or more of their attention {_ROLES[role]}, and each alone "
              f"moves accuracy by under {VITAL_ACCURACY:.0%} ({', '.join(f'{h.delta_accuracy:+.1%}' for h in hs)}); "
              f"closed together, accuracy moves {together['delta_accuracy']:+.1%} and loss "
              f"{together['delta_loss']:+.4f}: they back each other up, which single-head ablation cannot see")
    return {"kind": "redundant_group", "layer": hs[0].layer, "head": hs[0].head,
            "heads": [list(m) for m in members], "reason": reason, "together": together}


def _dominant(att: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The head's most striking pattern: a named role (first token, itself, previous token) when
    its key is where the peak weight goes (within ROLE_SLACK of max weight), else "a single key"."""
    known = {k: att.get(k) for k in _ROLES if _known(att.get(k))}
    if not known:
        return None, None
    named = {k: v for k, v in known.items() if k != "max_weight"}
    role = max(named, key=lambda k: named[k]) if named else None
    peak = known.get("max_weight")
    if role is None or (peak is not None and named[role] < peak - ROLE_SLACK):
        role = max(known, key=lambda k: known[k])
    return role, float(known[role])


def _tiny(h: HeadEffect, baseline_loss: float) -> bool:
    return abs(h.delta_accuracy) < TINY_ACCURACY and abs(h.delta_loss) < TINY_LOSS * baseline_loss + 1e-3


def _vital(h: HeadEffect, baseline_loss: float) -> bool:
    return -h.delta_accuracy >= VITAL_ACCURACY or h.delta_loss >= VITAL_LOSS * baseline_loss


def _effect(h: HeadEffect) -> str:
    lo, hi = h.delta_accuracy_ci or (float("nan"), float("nan"))
    return f"{h.delta_accuracy:+.1%} (95 % CI [{lo:+.1%}, {hi:+.1%}], p = {h.p_value:.2g})"


def backup_test(flag: dict[str, Any], together: dict[str, Any], singles: float | None = None) -> dict[str, Any]:
    """The flag with the redundancy it suspected measured: `together` is the GroupEffect (JSON) of
    the head closed with its twins, `singles` the sum of the group's single-head delta accuracies
    (None if some were not measured); the reason then says what that cost instead of "may"."""
    names = ", ".join(f"L{layer}.H{head}" for layer, head in flag["twins"])
    reason = flag["reason"].split("; ")[0]
    reason += (f"; closed together with its look-alike(s) {names}, accuracy moves "
               f"{together['delta_accuracy']:+.1%} and loss {together['delta_loss']:+.4f}")
    if singles is not None:
        extra = together["delta_accuracy"] - singles
        verdict = ("so it backs them up" if extra <= -TINY_ACCURACY else
                   "so it is not their backup" if abs(extra) < TINY_ACCURACY else "so they interfere")
        reason += f", against {singles:+.1%} for each removed alone, added up: {verdict}"
    return {**flag, "reason": reason, "together": together}


def _flag(kind: str, h: HeadEffect, reason: str) -> dict[str, Any]:
    return {"kind": kind, "layer": h.layer, "head": h.head, "reason": reason}


def _known(v: Any) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)
