"""Heatmap versus causal effect: rank correlations, and the heads where they disagree.

The causal effect of a head is its delta loss under ablation (positive: the model needs
it); it is finer-grained than delta accuracy, which saturates. Both halves of a flag are
judged against something a reviewer can check:

- "striking" is relative to the model itself: the head puts at least DECISIVE of its weight
  on one key or one role (first token, last token, itself, previous or next token) AND that
  share stands out among the model's own heads (robust z-score >= STRIKING_Z). In BERT-class
  models most heads pile weight on [CLS] and [SEP]; a peak there is the norm, not a finding.
- "inert" is equivalence, not a failed test: both 95 % intervals (delta accuracy and delta
  loss) lie inside the negligible band (`negligible`), so the data show the effect is small,
  rather than merely not showing that it is large.

`striking_but_inert` is such a head; `diffuse_but_vital` is the reverse (weight spread out
compared with the model's other heads, and a significant, sizeable effect). Flags are ranked
(`rank`, `score`) so the few heads worth a look come first. Look-alike striking heads of one
layer are also closed together: `redundant_group` flags a set that each barely matters alone
and takes the answer with it together.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
from scipy.stats import spearmanr

import torch

from .._head_label import heads_label
from ..adapters.base import AttentionSite
from ..statistics import roles
from .result import ATTENTION_STATS, HeadEffect
from .config import AblationConfig
from .together import ablate_together

EFFECT = "delta_loss"
DECISIVE = 0.5  # a pattern "looks decisive" when at least half its weight goes to one key / one role ...
STRIKING_Z = 2.0  # ... and it stands out among the model's heads (robust z-score of that share)
SPREAD_FLOOR = 0.05  # the robust spread never counts as under 5 points: a tight crowd makes no outlier of noise
DIFFUSE = 0.35  # "looks diffuse": no key and no role gets this much, and entropy above the model's median
TINY_ACCURACY = 0.01  # |delta accuracy| below 1 point: closing a head after another added nothing
VITAL_ACCURACY = 0.02  # vital: significant and at least 2 points of accuracy ...
VITAL_LOSS = 0.10  # ... or 10 % of the baseline loss
ROLE_SLACK = 0.05  # a named role's share this close to the max weight means the peak is on that role's key
_ORDER = {"diffuse_but_vital": 0, "striking_but_compensated": 1, "striking_but_inert": 1, "redundant_group": 2}


SINGLE_KEY = "max_weight"  # "a single key": the peak weight, wherever it goes


def _phrases() -> dict[str, str]:
    """What a striking pattern is called in a flag's reason: the peak on one key, or a role on one key per
    query (first / last token, itself, previous / next token), read from the statistics registry."""
    return {SINGLE_KEY: "on a single key", **{k: r.phrase for k, r in roles().items() if r.one_key}}


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
    out["second_order_delta_loss"] = spearman([h.second_order_delta_loss for h in heads], effect)
    return out


def flags(heads: Sequence[HeadEffect], baseline_loss: float, band: dict[str, float] | None = None
          ) -> list[dict[str, Any]]:
    """Heads whose heatmap and ablation disagree, each with the reason in words, ranked."""
    band = band or default_band(baseline_loss)
    out = []
    stand_out = striking(heads)
    group_of = {m: members for _, members in look_alikes(heads) for m in members}
    entropy = [h.attention.get("entropy") for h in heads if _known(h.attention.get("entropy"))]
    mid_entropy = float(np.median(entropy)) if entropy else float("nan")
    for h in heads:
        if not h.verified:
            continue
        _, share = _dominant(h.attention)
        key = (h.layer, h.head)
        inert = h.negligible if h.negligible is not None else negligible(h, band)
        if key in stand_out and inert:
            role, share, z, typical = stand_out[key]
            twins = [list(m) for m in group_of.get(key, []) if m != key]
            cover = (f"; {len(twins)} other head(s) of layer {h.layer} look the same and may cover for it "
                     "(single-head ablation misses redundancy)") if twins else ""
            flag = _inert_flag(h, role, share, typical, band, z, cover)
            out.append({**flag, "twins": twins} if twins else flag)
        elif (share is not None and share < DIFFUSE and _known(h.attention.get("entropy"))
              and h.attention["entropy"] > mid_entropy and h.significant and not inert and _vital(h, baseline_loss)):
            out.append(_flag("diffuse_but_vital", h,
                             f"its attention is spread out (at most {share:.0%} on any key or role, "
                             f"entropy {h.attention.get('entropy', float('nan')):.2f} nats against a median "
                             f"{mid_entropy:.2f} in this model), yet removing it changes accuracy by {_effect(h)} "
                             f"and loss by {_loss_effect(h)}", h.delta_loss / max(baseline_loss, 1e-12)))
    return rank(out)


def _inert_flag(h: HeadEffect, role: str, share: float, typical: float, band: dict, z: float,
                cover: str) -> dict[str, Any]:
    """striking_but_inert, or striking_but_compensated where the direct effect shows later layers make up
    for the head; where no direct effect was measured the reason says the head may be compensated."""
    looks = f"{share:.0%} of its attention goes {_phrases()[role]} (typical for this model: {typical:.0%})"
    total = (f"removing it changes accuracy by {_effect(h)} and loss by {_loss_effect(h)}, both inside the "
             f"negligible band (±{band['accuracy']:.0%} accuracy, ±{band['loss']:.3g} loss)")
    if h.compensated:
        return _flag("striking_but_compensated", h, f"{looks}, and {total}, yet its direct effect on the loss is "
                     f"{h.direct_delta_loss:+.4f}: the output reads it, and later layers make up for it when it is "
                     f"removed (self-repair){cover}", z)
    note = "" if h.compensated is False else (
        ". Its direct effect was not measured, so later layers may make up for it (self-repair): `direct` in the "
        "result says why, and closing it together with later heads (ablate_together) shows whether they do")
    return _flag("striking_but_inert", h, f"{looks}, yet {total}{note}{cover}", z)


def rank(flags_: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most telling first: vital heads by effect, then inert ones by how far they stand out, then groups;
    each flag gets its 1-based `rank`."""
    ordered = sorted(flags_, key=lambda f: (_ORDER.get(f["kind"], 9), -(f.get("score") or 0.0)))
    return [{**f, "rank": i} for i, f in enumerate(ordered, 1)]


def flags_with_groups(heads: list[HeadEffect], model: torch.nn.Module, batches: Sequence, config: AblationConfig,
                       sites: Sequence[AttentionSite], baseline: dict[str, float], band: dict,
                       distributed: bool | None = None) -> list[dict]:
    """The contrast flags, with look-alike heads closed together (one forward per batch and group)
    where that can change the story: a striking-but-inert member may be a backup, and heads that each
    barely matter alone may carry the answer together. config, distributed: as for ablate_together."""
    by_head = {(h.layer, h.head): h for h in heads}
    flags_ = flags(heads, baseline["loss"], band)
    inert = {(f["layer"], f["head"]) for f in flags_ if f["kind"] == "striking_but_inert"}
    effects: dict[tuple, dict] = {}

    def closed_together(members: tuple) -> dict:
        if members not in effects:
            effects[members] = ablate_together(model, batches, list(members), config=config, sites=sites,
                                               baseline=(baseline["accuracy"], baseline["loss"]),
                                               distributed=distributed).to_json()
        return effects[members]

    out = []
    for f in flags_:
        if f.get("twins"):
            members = tuple(sorted([(f["layer"], f["head"]), *(tuple(t) for t in f["twins"])]))
            singles = [by_head[m].delta_accuracy for m in members]
            f = backup_test(f, closed_together(members), None if None in singles else sum(singles))
        out.append(f)
    for role, members in look_alikes(heads):
        small = all(by_head[m].verified and abs(by_head[m].delta_accuracy) < VITAL_ACCURACY
                    for m in members)
        if small and not inert & set(members):  # inert members' flags already carry the group's effect
            group_flag = redundant_flag(role, members, by_head, closed_together(tuple(members)))
            if group_flag is not None:
                out.append(group_flag)
    return rank(out)


def default_band(baseline_loss: float, min_effect: float = 0.05) -> dict[str, float]:
    """The negligible band: |delta loss| under min_effect of the baseline loss (at least 0.001 nats)
    and |delta accuracy| under 2 points."""
    return {"loss": max(min_effect * baseline_loss, 1e-3), "accuracy": 0.02, "min_effect": min_effect}


def negligible(h: HeadEffect, band: dict[str, float]) -> bool:
    """Equivalence: both 95 % intervals inside the band (the point estimate where no interval is known)."""
    return equivalent(h.delta_loss, h.delta_loss_ci, h.delta_accuracy, h.delta_accuracy_ci, band)


def equivalent(delta_loss: float | None, loss_ci: list[float] | None, delta_accuracy: float | None,
               accuracy_ci: list[float] | None, band: dict[str, float]) -> bool:
    """Both 95 % intervals of one effect (total or direct) inside the band."""
    acc = accuracy_ci or [delta_accuracy, delta_accuracy]
    loss = loss_ci or [delta_loss, delta_loss]
    if None in (*acc, *loss):
        return False
    return max(abs(acc[0]), abs(acc[1])) < band["accuracy"] and max(abs(loss[0]), abs(loss[1])) < band["loss"]


def striking(heads: Sequence[HeadEffect]) -> dict[tuple[int, int], tuple[str, float, float, float]]:
    """(layer, head) -> (role, share, robust z-score, the model's median share on that role) for each
    head that puts at least DECISIVE of its weight on one role (first / last token, itself, previous /
    next token) or one key, where that share stands out among the model's own heads. A named role is
    preferred to "a single key" when both stand out: it says what the map shows."""
    patterns = _phrases()
    values = {k: [h.attention.get(k) for h in heads if _known(h.attention.get(k))] for k in patterns}
    centre = {k: float(np.median(v)) for k, v in values.items() if v}
    spread = {k: max(1.4826 * float(np.median(np.abs(np.array(v) - centre[k]))), SPREAD_FLOOR)
              for k, v in values.items() if v}
    out = {}
    for h in heads:
        best = None
        for k in patterns:
            share = h.attention.get(k)
            if not _known(share) or share < DECISIVE:
                continue
            z = (share - centre[k]) / spread[k]
            if z >= STRIKING_Z and (best is None or (best[0] == SINGLE_KEY and k != SINGLE_KEY) or
                                    (k != SINGLE_KEY and z > best[2])):
                best = (k, float(share), float(z), centre[k])
        if best is not None:
            out[(h.layer, h.head)] = best
    return out


def look_alikes(heads: Sequence[HeadEffect]) -> list[tuple[str, list[tuple[int, int]]]]:
    """(role, heads) for each set of two or more heads of one layer whose dominant pattern is the same
    role (first token, itself, previous token, ... or one key), each decisive; sorted heads. Decisive is
    enough here (not striking): these are the heads worth closing together, whatever the model's norm."""
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
    names = heads_label(((h.layer, h.head) for h in hs), ", ")
    reason = (f"{names} each put {min(shares):.0%} or more of their attention {_phrases()[role]}, and each alone "
              f"moves accuracy by under {VITAL_ACCURACY:.0%} ({', '.join(f'{h.delta_accuracy:+.1%}' for h in hs)}); "
              f"closed together, accuracy moves {together['delta_accuracy']:+.1%} and loss "
              f"{together['delta_loss']:+.4f}: they back each other up, which single-head ablation cannot see")
    return {"kind": "redundant_group", "layer": hs[0].layer, "head": hs[0].head, "role": hs[0].role,
            "score": singles - together["delta_accuracy"], "heads": [list(m) for m in members], "reason": reason,
            "together": together}


def _dominant(att: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The head's most striking pattern: a named role (first token, itself, previous token) when
    its key is where the peak weight goes (within ROLE_SLACK of max weight), else "a single key"."""
    known = {k: att.get(k) for k in _phrases() if _known(att.get(k))}
    if not known:
        return None, None
    named = {k: v for k, v in known.items() if k != SINGLE_KEY}
    role = max(named, key=lambda k: named[k]) if named else None
    peak = known.get(SINGLE_KEY)
    if role is None or (peak is not None and named[role] < peak - ROLE_SLACK):
        role = max(known, key=lambda k: known[k])
    return role, float(known[role])


def _vital(h: HeadEffect, baseline_loss: float) -> bool:
    return -h.delta_accuracy >= VITAL_ACCURACY or h.delta_loss >= VITAL_LOSS * baseline_loss


def _loss_effect(h: HeadEffect) -> str:
    if not h.delta_loss_ci:
        return f"{h.delta_loss:+.4f}"
    lo, hi = h.delta_loss_ci
    p = "" if h.p_value_loss is None else f", p = {h.p_value_loss:.2g}"
    return f"{h.delta_loss:+.4f} (95 % CI [{lo:+.4f}, {hi:+.4f}]{p})"


def _effect(h: HeadEffect) -> str:
    lo, hi = h.delta_accuracy_ci or (float("nan"), float("nan"))
    return f"{h.delta_accuracy:+.1%} (95 % CI [{lo:+.1%}, {hi:+.1%}], p = {h.p_value:.2g})"


def backup_test(flag: dict[str, Any], together: dict[str, Any], singles: float | None = None) -> dict[str, Any]:
    """The flag with the redundancy it suspected measured: `together` is the GroupEffect (JSON) of
    the head closed with its twins, `singles` the sum of the group's single-head delta accuracies
    (None if some were not measured); the reason then says what that cost instead of "may"."""
    names = heads_label(flag["twins"], ", ")
    reason = flag["reason"].split("; ")[0]
    reason += (f"; closed together with its look-alike(s) {names}, accuracy moves "
               f"{together['delta_accuracy']:+.1%} and loss {together['delta_loss']:+.4f}")
    if singles is not None:
        extra = together["delta_accuracy"] - singles
        verdict = ("so it backs them up" if extra <= -TINY_ACCURACY else
                   "so it is not their backup" if abs(extra) < TINY_ACCURACY else "so they interfere")
        reason += f", against {singles:+.1%} for each removed alone, added up: {verdict}"
    return {**flag, "reason": reason, "together": together}


def _flag(kind: str, h: HeadEffect, reason: str, score: float) -> dict[str, Any]:
    return {"kind": kind, "layer": h.layer, "head": h.head, "role": h.role, "score": score, "reason": reason}


def _known(v: Any) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)
