"""The fields of a step record, declared, and the one walk of a record that every reader uses.

What a record holds is declared where it is written: each registered `Measurement` carries its
`fields` (_measure.py), and MONITOR_FIELDS below are the ones the monitor writes itself. A field
is a `diagnose.schema.Field`; its `per` says where it sits in a record:

    model   a top-level key                       loss, grad_norm, z_mean
    layer   layers.<block>.<key>                  act_var, update_ratio
    head    attention.<site>.<key>, one per head  entropy, max_weight, max_logit
    site    attention.<site>.<key>, one number    uniform_entropy

`leaves` walks a record once; `flatten` (the live sinks, the TensorBoard export), `steps_row`
(Run.steps) and `attention_rows` (Run.attention) are built on it, and `record_keys` gives the keys of
one kind that some records hold, declared ones first. A number a record carries that nothing
declares (an older folder, a measurement registered only in the training process) is walked
too, under its own name: a reader shows it, never drops it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

from ..schema import Field
from ._measure import MEASUREMENTS, record_field

SKIP = ("step", "time", "session", "nonfinite")  # a record's keys that are not signals
MONITOR_FIELDS = (
    record_field("lr", "lr", ".4g"),
    record_field("micro_batches", "micro-batches", "d"),
    record_field("step_time", "step time", ".3g", "s"),
    record_field("sink_time", "sink time", ".3g", "s"),  # the user sinks' seconds per step, apart from step_time
    record_field("tokens", "tokens", "d"),
    record_field("tokens_per_s", "tokens/s", ".4g"),
)


def record_fields(per: str | None = None) -> list[Field]:
    """The declared fields of a step record (of one `per`, or all): each registered measurement's,
    in registry order, then the monitor's own; the first declaration of a (per, key) wins."""
    seen: dict[tuple[str, str], Field] = {}
    for f in (*(f for m in MEASUREMENTS for f in m.fields), *MONITOR_FIELDS):
        seen.setdefault((f.per, f.key), f)
    return [f for f in seen.values() if per is None or f.per == per]


def field_of(per: str, key: str) -> Field:
    """The declared field, or a plain one named by its key (a field nothing declares)."""
    for f in record_fields(per):
        if f.key == key:
            return f
    return record_field(key, key, per=per)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def leaves(record: dict[str, Any]) -> Iterator[tuple[str, str, str, Any]]:
    """(per, path, key, value) for every field of a step record, path `/`-joined as in Run.steps:
    `loss`, `layers/<block>/<key>`, `attention/<site>/<key>` (a list per head, or a number per site)."""
    for key, value in record.items():
        if key in SKIP:
            continue
        if key == "layers" and isinstance(value, dict):
            for block, stats in value.items():
                for k, v in (stats.items() if isinstance(stats, dict) else ()):
                    yield "layer", f"layers/{block}/{k}", k, v
        elif key == "attention" and isinstance(value, dict):
            for site, stats in value.items():
                for k, v in (stats.items() if isinstance(stats, dict) else ()):
                    yield ("head" if isinstance(v, list) else "site"), f"attention/{site}/{k}", k, v
        else:
            yield "model", key, key, value


def _hidden(place: str | None) -> set[tuple[str, str]]:
    return set() if place is None else {(f.per, f.key) for f in record_fields() if place not in f.show}


def flatten(record: dict[str, Any], prefix: str = "", place: str | None = None) -> dict[str, float]:
    """Every number of a step record by its path under `prefix`; null (None) and words left out.

    A list ends in `/head<h>` at an attention site (one number per head), `/<i>` elsewhere (one lr
    per parameter group); a nested object nests its path. `place`: leave out the declared fields
    not shown there (schema.PLACES)."""
    out: dict[str, float] = {}
    hidden = _hidden(place)

    def walk(path: str, v: Any, head: str) -> None:
        if _is_number(v):
            out[path] = float(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{path}/{k}", x, "")
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                if _is_number(x):
                    out[f"{path}/{head}{i}"] = float(x)

    for per, path, key, value in leaves(record):
        if (per, key) not in hidden:
            walk(prefix + path, value, "head" if per == "head" else "")
    return out


def steps_row(record: dict[str, Any]) -> dict[str, Any]:
    """One record as a row of Run.steps: the top-level values as they are (a NaN, a None, a word
    kept), each block's fields, each site's numbers and, for a per-head field, `<key>_mean`, the
    mean over the heads (NaN for an empty list)."""
    row = {k: v for k, v in record.items() if k in ("step", "time", "session")}
    for per, path, key, value in leaves(record):
        if per == "head":
            nums = [float(v) for v in value if _is_number(v)]
            row[f"{path}_mean"] = sum(nums) / len(nums) if nums else math.nan
        elif not isinstance(value, (dict, list)):
            row[path] = value
    return row


def record_keys(records: Iterable[dict[str, Any]], per: str) -> list[str]:
    """The keys of `per` fields the records hold: the declared ones first, in declaration order,
    then any other in the order first seen. Model keys are the top-level ones that are not objects."""
    seen: dict[str, None] = {}
    for rec in records:
        for p, _, key, value in leaves(rec):
            if p == per and not (per == "model" and isinstance(value, dict)):
                seen.setdefault(key)
    declared = [f.key for f in record_fields(per) if f.key in seen]
    return declared + [k for k in seen if k not in declared]


def attention_rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(one row per step, site and head with every per-head field, NaN where a field has no value
    for that head; the per-head keys, in record_keys's order): what Run.attention holds."""
    keys = record_keys(records, "head")
    rows = []
    for r in records:
        for site, stats in (r.get("attention") or {}).items():
            lists = {k: stats[k] for k in keys if isinstance(stats, dict) and isinstance(stats.get(k), list)}
            for h in range(max((len(v) for v in lists.values()), default=0)):
                rows.append({"step": r.get("step"), "site": site, "head": h,
                             **{k: (v[h] if h < len(v) and v[h] is not None else math.nan) for k, v in lists.items()}})
    return rows, keys
