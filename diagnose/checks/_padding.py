"""Padding leak: do outputs at real positions change when only the padding changes?

Real rows are padded on the right (and, for per-position outputs, on the left too) and
compared, in one batched forward, with copies whose padded positions hold other tokens, and
with copies that carry extra padding at the end. A model that masks padded keys with a large
negative number gives identical outputs at real positions (and identical pooled outputs); a
missing padding mask, a mask filled with 0, or pooling over padded positions changes them.
The attention mass that real queries put on padded keys (diagnose.attention_summary, the
larger of right and left padding) is reported beside it. Models whose forward takes no
attention_mask are skipped: to them padding is text.
"""

from __future__ import annotations

from typing import Any

import torch

from ..modes import eval_mode
from ._subject import SAME, Subject, device_of, forward, inputs_for, relative_change, token_level
from ._finding import Finding, SkipCheck

NAME = "padding"
EXTRA = 4  # padded positions appended for the padding-length variant

_FIX = ("Pass attention_mask to every attention layer and mask padded keys before the softmax with "
        "float('-inf') or torch.finfo(scores.dtype).min -- filling with 0 still gives each padded key "
        "weight exp(0) -- and pool only over real positions (sum(x * mask) / sum(mask)).")


def _pad(real: torch.Tensor, lengths: torch.Tensor, total: int, pad_id: int,
         left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of real[i, :lengths[i]] padded with pad_id to `total`.  # ids, mask: [B, total]"""
    B = real.shape[0]
    ids = torch.full((B, total), pad_id, dtype=torch.long)
    mask = torch.zeros(B, total, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        sl = slice(total - n, total) if left else slice(0, n)
        ids[i, sl], mask[i, sl] = real[i, :n], 1
    return ids, mask


def _cases(subject: Subject) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per variant (clean ids, clean mask, changed ids, changed mask): other tokens in right and in
    left padding, and more padding; raises SkipCheck when the model cannot take padding."""
    info = subject.info
    if not info.takes_mask:
        raise SkipCheck("the model's forward takes no attention_mask, so padding cannot be told apart from tokens")
    real = subject.rows  # [B, T]
    B, T = real.shape
    g = subject.generator(2)
    room = (info.max_len - T) if info.max_len else EXTRA
    base = T if room >= EXTRA else T - (EXTRA - room)  # leave room for the extra padding
    if base < 3:
        raise SkipCheck(f"the model's max_len {info.max_len} leaves no room for padding")
    lengths = torch.randint(2, base, (B,), generator=g)  # [B], at least one padded position each
    cases: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for side in ("right", "left"):
        ids, mask = _pad(real, lengths, base, info.pad_id, left=side == "left")
        other = torch.where(mask.bool(), ids, subject.different_tokens(ids, g))  # padded positions hold other tokens
        cases[f"content_{side}"] = (ids, mask, other, mask)
    ids, mask = cases["content_right"][:2]
    longer = torch.cat([ids, torch.full((B, EXTRA), info.pad_id, dtype=torch.long)], 1)  # [B, base + EXTRA]
    cases["length"] = (ids, mask, longer, torch.cat([mask, torch.zeros(B, EXTRA, dtype=torch.long)], 1))
    return cases


def _changes(outs: dict[str, tuple[torch.Tensor, torch.Tensor]], cases: dict, per_token: bool
             ) -> tuple[dict[str, float], list[str]]:
    """(relative change at real positions per variant, variants whose clean outputs are not finite)."""
    change: dict[str, float] = {}
    nonfinite: list[str] = []
    for name, (clean, changed) in outs.items():
        if name == "content_left" and not per_token:
            continue  # a pooled model may read position 0 (CLS pooling), which left padding fills with padding
        m = cases[name][1].bool()  # [B, base] real positions of the clean input
        if per_token:
            clean, changed = clean[m], changed[:, : m.shape[1]][m]  # [n_real, V]
        if not bool(torch.isfinite(clean).all()):
            # e.g. a fully masked row under SDPA gives NaN that spreads: not a padding leak, not testable
            nonfinite.append(name)
            continue
        change[name] = float(relative_change(clean, changed).max())
    return change, nonfinite


def check_padding(subject: Subject) -> list[Finding]:
    """Findings of the padding-leak test; raises SkipCheck when it cannot run."""
    info = subject.info
    cases = _cases(subject)
    with eval_mode(subject.model), torch.no_grad():
        outs = {}
        for name, (a, am, b, bm) in cases.items():
            outs[name] = (forward(subject.model, info, a, am), forward(subject.model, info, b, bm))
    per_token = token_level(outs["content_right"][0], cases["content_right"][0])
    change, evidence_nonfinite = _changes(outs, cases, per_token)
    if not change:
        raise SkipCheck("the model's outputs at real positions are not finite on padded input")
    evidence: dict[str, Any] = {f"max_relative_change_{k}": v for k, v in change.items()}
    evidence["threshold"] = SAME
    if evidence_nonfinite:
        evidence["variants_with_nonfinite_outputs"] = len(evidence_nonfinite)
    sides = ("content_right", "content_left") if per_token else ("content_right",)
    masses = [padding_mass(subject, *cases[side][:2]) for side in sides]
    mass = None if any(m is None for m in masses) else [max(v) for v in zip(*masses)]
    if mass is not None:
        evidence["attention_mass_on_padding_per_layer"] = mass
    if max(change.values()) <= SAME:
        return []
    leaking = {k for k, v in change.items() if v > SAME}
    if leaking == {"content_left"} and (mass is None or max(mass) <= SAME):
        # RoBERTa / XLM-R number positions by counting non-pad ids: other tokens in left padding shift
        # the real tokens' positions. Real padding holds the pad id, so nothing leaks in use.
        return [Finding(NAME, "info", "Outputs at real positions depend on the pad id in left padding (not on "
                        "more padding, right padding or attention to padding): the model reads the pad id itself, "
                        "e.g. to number positions", evidence,
                        "Fine as long as padding holds the pad id (tokenizers do); otherwise see: " + _FIX)]
    what = [w for w, keys in (("padding content", ("content_right", "content_left")), ("padding length", ("length",)))
            if any(change.get(k, 0.0) > SAME for k in keys)]
    return [Finding(NAME, "error", f"Padding leak: outputs at real positions change with the {' and '.join(what)}",
                    evidence, _FIX)]


def padding_mass(subject: Subject, ids: torch.Tensor, mask: torch.Tensor) -> list[float] | None:
    """Per layer, the largest (over heads) mean attention mass real queries put on padded keys."""
    from ..attention_stats import attention_summary
    from ..errors import DiagnoseError

    try:
        with eval_mode(subject.model), torch.no_grad():
            inputs = inputs_for(subject.info, ids, mask, device_of(subject.model))
            summary = attention_summary(subject.model, [inputs], keep=0)
    except DiagnoseError:  # no attention layer found: the output test stands alone
        return None
    return [max(site["padding"]) for site in summary.stats]
