"""Type checks for what a run folder holds, so that a damaged or hand-edited run.json or
metrics.jsonl is refused with one line naming the file, never a TypeError deep in a summary. The
number fields are the declared ones (_fields.record_fields); a per-head list is checked whatever
its name.

A torn last line is not damage (a killed writer leaves one) and is skipped by the reader; a
line that parses but holds the wrong types is damage and is refused here.
"""

from __future__ import annotations

from typing import Any

from .._numbers import kind, number
from ..errors import RunFolderError
from ._fields import record_fields

MAX_STEP = 2 ** 63 - 1  # a step is an int64 wherever it goes (pandas, TensorBoard's event files)
FIX = _FIX = "the file was not written by diagnose.TrainingMonitor, or was edited: restore it or start a new run folder"


def _number_fields() -> list[str]:
    """The top-level keys that must hold a number (or null): `time` and every declared model-level
    field that is not a word (_fields.record_fields)."""
    return ["time", *(f.key for f in record_fields("model") if f.fmt != "s")]


def _is_number(value: Any) -> bool:
    return value is None or number(value) is not None


def is_step(value: Any) -> bool:
    """Whether `value` is a step as the readers use it: an integer from 0 to MAX_STEP (an int64)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def check_step(step: Any) -> int:
    """TrainingMonitor.step(step=...) as the readers will take it back: an integer from 0 to MAX_STEP
    (ConfigError otherwise, before anything is written)."""
    from ..errors import ConfigError

    try:
        value = int(step)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"step= must be an integer, got {type(step).__name__}") from None
    if isinstance(step, bool) or not is_step(value):
        raise ConfigError(f"step= must be an integer from 0 to 2**63 - 1, got {step!r:.30}")
    return value


def _check_step(value: Any, where: str, key: str = "step") -> None:
    if not is_step(value):
        raise RunFolderError(f"{where}: `{key}` is {_kind(value)}{f' {value!r:.30}' if number(value) is not None else ''}"
                             f", not a step (an integer from 0 to 2**63 - 1); {_FIX}")


_kind = kind


def check_info(info: Any, where: str) -> None:
    """Raise RunFolderError unless run.json's fields have the types the readers use."""
    if not isinstance(info, dict):
        raise RunFolderError(f"{where}: holds {_kind(info)}, not an object; {_FIX}")
    for key, want, name in (("model", dict, "an object"), ("settings", dict, "an object"),
                            ("sessions", list, "a list")):
        if key in info and not isinstance(info[key], want):
            raise RunFolderError(f"{where}: `{key}` is {_kind(info[key])}, not {name}; {_FIX}")
    blocks = (info.get("model") or {}).get("blocks")
    if blocks is not None and not (isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)):
        raise RunFolderError(f"{where}: `model.blocks` is not a list of names; {_FIX}")
    if not all(isinstance(s, dict) for s in info.get("sessions") or []):
        raise RunFolderError(f"{where}: `sessions` holds something other than objects; {_FIX}")
    _check_signals(info.get("signals"), where)
    settings = info.get("settings") or {}
    for name, value in (("clip", info.get("clip")), *((f"settings.{k}", settings.get(k)) for k in _SETTINGS)):
        if not _is_number(value):
            raise RunFolderError(f"{where}: `{name}` is {_kind(value)}, not a number; {_FIX}")


_SETTINGS = ("clip", "every", "attention_every", "world_size", "spike_bytes")  # the numbers the readers print


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_signals(signals: Any, where: str) -> None:
    """run.json's "signals" (_declare.py): {"model": [names], "layers" and "attention": {part: [names]}}."""
    if signals is None:
        return
    if not isinstance(signals, dict):
        raise RunFolderError(f"{where}: `signals` is {_kind(signals)}, not an object; {_FIX}")
    if not _names(signals.get("model", [])):
        raise RunFolderError(f"{where}: `signals.model` is not a list of names; {_FIX}")
    for part in ("layers", "attention"):
        parts = signals.get(part, {})
        if not (isinstance(parts, dict) and all(_names(v) for v in parts.values())):
            raise RunFolderError(f"{where}: `signals.{part}` is not an object of lists of names; {_FIX}")


def check_record(rec: dict[str, Any], where: str) -> None:
    """Raise RunFolderError unless a metrics record's fields have the types the readers use."""
    _check_step(rec.get("step"), where)
    for key in _number_fields():
        value = rec.get(key)
        if key == "lr" and isinstance(value, list) and all(_is_number(v) for v in value):
            continue  # monitor.step(lr=scheduler.get_last_lr()): one per parameter group
        if not _is_number(value):
            raise RunFolderError(f"{where}: `{key}` is {_kind(value)}, not a number; {_FIX}")
    layers = rec.get("layers")
    if layers is not None:
        if not isinstance(layers, dict):
            raise RunFolderError(f"{where}: `layers` is {_kind(layers)}, not an object; {_FIX}")
        for name, stats in layers.items():
            if not isinstance(stats, dict) or not all(_is_number(v) for v in stats.values()):
                raise RunFolderError(f"{where}: `layers.{_short(name)}` is not an object of numbers; {_FIX}")
    attention = rec.get("attention")
    if attention is not None:
        if not isinstance(attention, dict):
            raise RunFolderError(f"{where}: `attention` is {_kind(attention)}, not an object; {_FIX}")
        for site, stats in attention.items():
            if not isinstance(stats, dict):
                raise RunFolderError(f"{where}: `attention.{_short(site)}` is {_kind(stats)}, not an object; {_FIX}")
            for key, values in stats.items():  # every per-head field a measurement wrote, declared or not
                if not (_is_number(values) or isinstance(values, list) and all(_is_number(v) for v in values)):
                    raise RunFolderError(f"{where}: `attention.{_short(site)}.{_short(key)}` is not a list of "
                                         f"numbers (one per head) nor a number; {_FIX}")


def check_alert(rec: dict[str, Any], where: str) -> None:
    """Raise RunFolderError unless an alert's fields are what the readers print."""
    for key in ("kind", "severity", "where", "message", "hint"):
        if key in rec and rec[key] is not None and not isinstance(rec[key], str):
            raise RunFolderError(f"{where}: `{key}` is {_kind(rec[key])}, not a string; {_FIX}")
    if rec.get("step") is not None:
        _check_step(rec["step"], where)


def _short(name: Any) -> str:
    text = str(name)
    return text if len(text) <= 40 else text[:37] + "..."

