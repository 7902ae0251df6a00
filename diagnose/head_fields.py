"""The heads JSON (`diagnose.heads/2`) declared once: its top-level keys by kind, and one head
(each `heads[i]`) as fields.

The writer (`ablation/result.py`: `HeadEffect`, one key per field; a test holds the two together),
`HeadsResult.to_frame`, the report's validation (`reports/_sources.py`) and its parsing into grids
(`reports/view_heads.py`) all walk these tuples, so a per-head number added to `HeadEffect` is declared
here, once, and every reader checks, parses and tabulates it. The attention statistics sit under each
head's `attention` object and are declared by their own registry (`diagnose/statistics.py`):
`attention_fields()` are their fields.

Torch-free on purpose: the report (which reads only files) imports it.

The document: DOCUMENT_WORDS and DOCUMENT_COUNTS are a string and an integer, DOCUMENT_OBJECTS an
object or null, DOCUMENT_LISTS a list or absent; `sections` are `diagnose.schema.Section`s (absent in
files from before them). One head:

    IDS        the head's place: integers
    NUMBERS    a number, or null where it was not measured (--fast's unverified heads, no direct path)
    FLAGS      true / false, or null
    WORDS      a string, or null
    INTERVALS  a [low, high] pair of numbers (95 %), or null
"""

from __future__ import annotations

from .schema import Field
from .statistics import STATISTICS


def _head(key: str, label: str, fmt: str = ".3g", unit: str = "") -> Field:
    return Field(key, label, fmt, unit, per="head")


IDS = (_head("layer", "layer", "d"), _head("head", "head", "d"))
NUMBERS = (
    _head("accuracy", "accuracy", ".2%"),
    _head("delta_accuracy", "Δacc", "+.2%"),
    _head("p_value", "p (Δacc)", ".2g"),
    _head("p_value_adjusted", "p (Δacc), corrected", ".2g"),
    _head("loss", "loss", ".4f", "nats"),
    _head("delta_loss", "Δloss", "+.4f", "nats"),
    _head("kl", "KL", ".4f", "nats"),
    _head("grad_importance", "grad imp.", ".3f"),
    _head("grad_importance_raw", "grad imp., raw", ".3g"),
    _head("estimated_delta_loss", "Δloss, first-order estimate", "+.3g", "nats"),
    _head("p_value_loss", "p (Δloss), uncorrected", ".2g"),
    _head("p_value_loss_adjusted", "p (Δloss)", ".2g"),
    _head("second_order_delta_loss", "Δloss, second-order estimate", "+.3g", "nats"),
    _head("direct_delta_loss", "direct Δloss", "+.4f", "nats"),
    _head("direct_delta_accuracy", "direct Δacc", "+.2%"),
    _head("direct_p_value_loss", "direct p (Δloss), uncorrected", ".2g"),
    _head("direct_p_value_loss_adjusted", "direct p (Δloss)", ".2g"),
    _head("self_repair", "self-repair", "+.4f", "nats"),
    _head("logit_diff", "logit diff", ".3f"),
    _head("delta_logit_diff", "Δlogit diff", "+.3f"),
)
FLAGS = (
    _head("significant", "significant", "s"),
    _head("verified", "verified", "s"),
    _head("negligible", "negligible", "s"),
    _head("direct_significant", "direct significant", "s"),
    _head("compensated", "compensated", "s"),
)
WORDS = (_head("role", "role", "s"), _head("verdict", "verdict", "s"))
INTERVALS = (
    _head("delta_accuracy_ci", "Δacc, 95 % CI", "+.2%"),
    _head("delta_loss_ci", "Δloss, 95 % CI", "+.4f", "nats"),
    _head("direct_delta_loss_ci", "direct Δloss, 95 % CI", "+.4f", "nats"),
    _head("direct_delta_accuracy_ci", "direct Δacc, 95 % CI", "+.2%"),
    _head("delta_logit_diff_ci", "Δlogit diff, 95 % CI", "+.3f"),
)

DOCUMENT_WORDS = ("schema", "task", "method")
DOCUMENT_COUNTS = ("n_examples", "n_units")
DOCUMENT_OBJECTS = ("model", "baseline", "timing", "significance", "fast", "correlations", "direct", "agreement")
DOCUMENT_LISTS = ("heads", "flags", "together", "examples", "sections")

ATTENTION = "attention"  # an object under each head: statistic name -> number (the statistics registry)
HEAD_FIELDS = (*IDS, *NUMBERS, *FLAGS, *WORDS, *INTERVALS)  # every key of one head but `attention`
HEAD_NUMBERS = tuple(f.key for f in NUMBERS)
# the report's table of the heads whose removal hurts most, in this order (then the statistics it shows)
REPORT_TABLE = ("verdict", "delta_accuracy", "delta_accuracy_ci", "delta_loss", "delta_logit_diff",
                "delta_logit_diff_ci", "p_value_loss_adjusted", "direct_delta_loss", "self_repair", "kl",
                "grad_importance")
# ... of which these only where some head has them (data that names wrong answers: wrong_labels)
REPORT_TABLE_MEASURED = ("delta_logit_diff", "delta_logit_diff_ci")  # the per-head numbers the report draws as layer x head grids


def by_key() -> dict[str, Field]:
    """Every declared head field by its key."""
    return {f.key: f for f in HEAD_FIELDS}


def attention_fields() -> list[Field]:
    """A field per registered attention statistic (its column header and format), read at each use."""
    return [Field(s.name, s.column, s.fmt, per="head") for s in STATISTICS.values()]


def head_keys() -> list[str]:
    """Every key of one head in the JSON, in declaration order."""
    return [*(f.key for f in HEAD_FIELDS), ATTENTION]
