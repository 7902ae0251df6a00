"""Every field a run's records hold, as the report's tables: data before pictures.

Walks the record declarations (`diagnose.monitor.record_fields`, each measurement's `fields`)
and the records themselves, so that a registered measurement's field, per model, per block or
per head, is shown with its label, unit and format, and one nothing declares is shown by its name:

    model  one row per field: its value at the last logged step, and its finite minimum and maximum
    layer  one row per block, one column per field, at the last logged step
    head   one row per (site, head), one column per field, at the last sampled step (with the
           site's own numbers, such as the uniform entropy)

Each table is a `diagnose.schema.Section`, rendered by the training template.
"""

from __future__ import annotations

import math
from typing import Any

from diagnose.monitor import field_of, record_keys
from diagnose.schema import Field, Section

def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _shown(per: str, keys: list[str]) -> list[Field]:
    return [f for f in (field_of(per, k) for k in keys) if "report" in f.show]


def _model(records: list[dict[str, Any]]) -> Section | None:
    fields = _shown("model", record_keys(records, "model"))
    rows = []
    for f in fields:
        values = [r.get(f.key) for r in records]
        finite = [x for x in map(_num, values) if x is not None and math.isfinite(x)]
        last = next((v for v in reversed(values) if v is not None), None)
        rows.append({"field": f.header, "last": f.format(last) if not isinstance(last, list) else
                     ", ".join(f.format(x) for x in last),
                     "min": f.format(min(finite)) if finite else None,
                     "max": f.format(max(finite)) if finite else None})
    cols = (Field("field", "field", "s"), Field("last", "last logged value", "s"),
            Field("min", "finite minimum", "s"), Field("max", "finite maximum", "s"))
    return Section("fields-model", "Model-level fields", cols, rows) if rows else None


def _layers(records: list[dict[str, Any]], blocks: list[str]) -> Section | None:
    fields = [f for f in _shown("layer", record_keys(records, "layer")) if f.key != "block"]
    last = records[-1].get("layers") or {} if records else {}
    if not fields or not isinstance(last, dict):
        return None
    names = blocks + [n for n in last if n not in blocks]
    rows = [{"block": n, **{f.key: (last.get(n) or {}).get(f.key) for f in fields}} for n in names if n in last]
    return Section("fields-layer", "Per-block fields at the last logged step",
                   (Field("block", "block", "s"), *fields), rows)


def _heads(records: list[dict[str, Any]]) -> Section | None:
    sampled = [r for r in records if isinstance(r.get("attention"), dict) and r["attention"]]
    if not sampled:
        return None
    rec = sampled[-1]
    heads = [f for f in _shown("head", record_keys(sampled, "head")) if f.key not in ("site", "head")]
    sites = [f for f in _shown("site", record_keys(sampled, "site")) if f.key not in ("site", "head")]
    rows = []
    for site, stats in rec["attention"].items():
        if not isinstance(stats, dict):
            continue
        n = max((len(stats[f.key]) for f in heads if isinstance(stats.get(f.key), list)), default=0)
        for h in range(n):
            row = {"site": site, "head": h}
            for f in heads:
                values = stats.get(f.key)
                row[f.key] = values[h] if isinstance(values, list) and h < len(values) else None
            row.update({f.key: stats.get(f.key) if _num(stats.get(f.key)) is not None else None for f in sites})
            rows.append(row)
    cols = (Field("site", "site", "s"), Field("head", "head", "d"), *heads, *sites)
    return Section("fields-head", f"Per-head fields at the last sampled step ({rec.get('step')})", cols,
                   rows) if rows else None


def field_tables(run: Any) -> list[Section]:
    """The run's record fields as tables (model, per block, per head); [] for a run without records."""
    records = [r for r in (getattr(run, "records", None) or []) if isinstance(r, dict)]
    if not records:
        return []
    blocks = list(getattr(run, "layers", None) or [])
    return [s for s in (_model(records), _layers(records, blocks), _heads(records)) if s is not None]
