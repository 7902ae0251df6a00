"""run.json's "signals": what each part of the model records, read off the first records that hold it.

    "signals": {"model": ["loss", "grad_norm", ...],
                "layers": {block: ["act_var", "grad_norm", ...]},
                "attention": {site: ["entropy", "max_weight", "max_logit", ...]}}

The keys are the registered measurements' declared record keys (Measurement.keys) that a record
holds a number (or list of numbers) under. "model" and "layers" come from the first logged step,
"attention" from the first step attention was sampled at; run.json is rewritten (whole, renamed
into place) when a part is first seen, so at most twice a session. A site whose list lacks a
signal its neighbours have is named by `diagnose stats` with the reason (_lacking.py).
"""

from __future__ import annotations

from typing import Any

from ._measure import MEASUREMENTS


def _number(x: Any) -> bool:
    if isinstance(x, list):
        return any(_number(v) for v in x)
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def signals_of(record: dict[str, Any]) -> dict[str, Any]:
    """{"model": [...], "layers": {block: [...]}, "attention": {site: [...]}} of one record ("attention"
    only when it was sampled)."""
    model: list[str] = []
    parts: dict[str, dict[str, list[str]]] = {"layers": {}, "attention": {}}
    for m in MEASUREMENTS:
        for key in m.keys:
            part, _, field = key.partition(".*.")
            if not field:
                if _number(record.get(key)) and key not in model:
                    model.append(key)
                continue
            for name, stats in (record.get(part) or {}).items():
                if isinstance(stats, dict) and _number(stats.get(field)):
                    parts.setdefault(part, {}).setdefault(name, []).append(field)
    out: dict[str, Any] = {"model": model, "layers": parts["layers"]}
    if parts["attention"]:
        out["attention"] = parts["attention"]
    return out


def declare(folder: Any, record: dict[str, Any]) -> None:
    """Add this record's signals to run.json where a part (model and layers, attention) is new there."""
    writer = getattr(folder, "writer", None)
    if writer is None:
        return
    have = writer.info.get("signals") or {}
    if "model" in have and not record.get("attention"):
        return  # the common case once the first step is declared: nothing new, nothing computed
    new = signals_of(record)
    if "model" in have and ("attention" in have or "attention" not in new):
        return
    merged = {**new, **{k: v for k, v in have.items() if k in new}}
    writer.info["signals"] = merged
    writer._write_info()
