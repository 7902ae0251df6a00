"""What an ablation sweep found: plain dataclasses, the `diagnose.heads/2` JSON, a DataFrame."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import _json
from ..head_fields import ATTENTION, HEAD_FIELDS, INTERVALS
from ..schema import Section
from ..statistics import ATTENTION_STATS
from .._write import atomic_write

# /2 adds direct effects (per head direct_*, self_repair, compensated; top-level direct), and then, additively,
# `sections` (the analysis steps' tables; a reader of an older /2 file sees none)
SCHEMA = "diagnose.heads/2"


@dataclass
class HeadEffect:
    """One head. Exact fields are None for heads that --fast ranked but did not verify.

    Each field is declared for the readers in diagnose/head_fields.py (its kind, label and format): a new
    one is added there too (tests/ablation/test_engine.py holds the two together)."""

    layer: int
    head: int
    accuracy: float | None
    delta_accuracy: float | None
    delta_accuracy_ci: list[float] | None  # [lo, hi], 95 %
    p_value: float | None  # paired sign test / exact McNemar, uncorrected
    p_value_adjusted: float | None  # corrected (Holm, or BH) across the heads tested
    significant: bool | None  # p_value_loss_adjusted < alpha: the delta-loss test decides
    loss: float | None
    delta_loss: float | None
    kl: float | None  # KL(clean || ablated) per scored unit, nats
    grad_importance: float  # Michel et al. 2019: E|dL/dxi_h|, l2-normalised within the layer
    grad_importance_raw: float  # E|dL/dxi_h| before normalisation (comparable across layers)
    estimated_delta_loss: float  # attribution patching: first-order change of the loss
    verified: bool  # exact ablation computed
    attention: dict[str, float | None] = field(default_factory=dict)
    delta_loss_ci: list[float] | None = None  # [lo, hi], 95 %, paired bootstrap over examples
    p_value_loss: float | None = None  # sign-flip permutation test on per-example delta loss, uncorrected
    p_value_loss_adjusted: float | None = None  # corrected across the heads tested; drives `significant`
    negligible: bool | None = None  # both 95 % CIs inside the negligible band (equivalence)
    role: str | None = None  # what its attention does, named from the model's own heads (roles.py)
    second_order_delta_loss: float | None = None  # -dL/dxi + (empirical Fisher) / 2: the --fast ranking
    # "matters", "detectable but negligible", "negligible" or "undecided" (verdict.py); None: not verified
    verdict: str | None = None
    # direct effect (direct.py): removed on the direct path to the output only, downstream frozen; None: not measured
    direct_delta_loss: float | None = None
    direct_delta_loss_ci: list[float] | None = None  # [lo, hi], 95 %, the same bootstrap as delta_loss_ci
    direct_delta_accuracy: float | None = None
    direct_delta_accuracy_ci: list[float] | None = None
    direct_p_value_loss: float | None = None  # the same loss test as p_value_loss, uncorrected
    direct_p_value_loss_adjusted: float | None = None  # corrected across the heads whose direct effect was measured
    direct_significant: bool | None = None
    self_repair: float | None = None  # direct_delta_loss - delta_loss (self_repair.py)
    compensated: bool | None = None  # the direct effect matters, the total does not
    # the logit difference label - wrong answer (data with wrong_labels, e.g. IOI: indirect object - subject), per
    # unit with both, the head ablated; its change from clean and 95 % interval. None: the data names no wrong answers
    logit_diff: float | None = None
    delta_logit_diff: float | None = None
    delta_logit_diff_ci: list[float] | None = None


@dataclass
class HeadsResult:
    """The whole sweep; `to_json()` is what the report and the CLI read."""

    model: dict[str, Any]  # family, n_layers, n_heads
    task: str
    method: str
    n_examples: int
    n_units: int
    baseline: dict[str, float]  # accuracy, loss, and logit_diff where the data names wrong answers
    heads: list[HeadEffect]
    correlations: dict[str, Any]
    flags: list[dict[str, Any]]
    timing: dict[str, Any]  # seconds, forward_passes, ...
    significance: dict[str, Any]
    fast: dict[str, Any] | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)
    together: list[dict[str, Any]] = field(default_factory=list)  # GroupEffect.to_json() of groups closed at once
    agreement: dict[str, Any] | None = None  # --methods: each head's verdict per method (verdict.agreement)
    direct: dict[str, Any] | None = None  # how direct effects were measured (heads, norm, cost), or why not
    sections: list[Section] = field(default_factory=list)  # the analysis steps' tables (analyses.py)

    def head(self, layer: int, head: int) -> HeadEffect:
        for h in self.heads:
            if h.layer == layer and h.head == head:
                return h
        raise KeyError((layer, head))

    def ranked(self) -> list[HeadEffect]:
        """Verified heads first, by how much their removal hurts (delta loss), then the rest as --fast ranked them."""
        by = (self.fast or {}).get("ranked_by", "second_order_delta_loss")
        return sorted(self.heads, key=lambda h: (not h.verified, -(h.delta_loss if h.verified else getattr(h, by))))

    def to_json(self) -> dict[str, Any]:
        out = {
            "schema": SCHEMA,
            "model": self.model,
            "task": self.task,
            "method": self.method,
            "n_examples": self.n_examples,
            "n_units": self.n_units,
            "baseline": self.baseline,
            "heads": [asdict(h) for h in self.heads],
            "correlations": self.correlations,
            "flags": self.flags,
            "timing": self.timing,
            "significance": self.significance,
            "fast": self.fast,
            "examples": self.examples,
            "together": self.together,
            "direct": self.direct,
            "sections": [s.to_json() for s in self.sections],
        }
        if self.agreement is not None:
            out["agreement"] = self.agreement
        return _finite(out)

    def to_frame(self):
        """One row per head, a column per declared field (head_fields.py): each interval as `<key>_low` and
        `<key>_high`, the attention statistics prefixed `attn_`."""
        import pandas as pd

        rows = []
        for h in self.heads:
            row: dict[str, Any] = {}
            for f in HEAD_FIELDS:
                value = getattr(h, f.key)
                if f in INTERVALS:
                    row[f"{f.key}_low"], row[f"{f.key}_high"] = value or (None, None)
                else:
                    row[f.key] = value
            row.update({f"attn_{k}": getattr(h, ATTENTION).get(k) for k in ATTENTION_STATS})
            rows.append(row)
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically: a temporary file renamed over the target."""
        return write_json_atomic(self.to_json(), path)



def write_json_atomic(obj: Any, path: str | Path) -> Path:
    """Nothing half-written: strict JSON through the one atomic write."""
    return atomic_write(path, _json.dumps(obj, indent=1), what="heads JSON")


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: they become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
