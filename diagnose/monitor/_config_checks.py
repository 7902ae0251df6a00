"""The checks of MonitorConfig's values, each made when the config is built (issue 36): a value that
would crash a step later (on_alert=5 at the first alert, clip='abc' at the first logged step), pass
silently for something else (save_spikes='no' saves spikes, raise_on=['nonfinte'] never stops), or
write a run.json the readers refuse (spike_bytes=1e300, settings={'every': 'x'}) is refused here with
one line naming the setting and what it takes."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Iterable, Mapping

from .. import _json
from .._numbers import number
from ..errors import ConfigError, UsageError

MAX_COUNT = 2 ** 63 - 1  # a count of steps or bytes, as a step is numbered: an int64
OWN_SETTINGS = ("every", "attention_every", "clip", "world_size", "save_spikes", "spike_bytes", "skip_on",
                "stop_on", "thresholds")  # run.json's settings the monitor writes itself (TrainingMonitor._info)


def count(name: str, value: Any, low: int, note: str = "") -> int:
    """A whole number from `low` to 2**63 - 1, as a Python int (numpy's integers too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be a whole number{note}, got {type(value).__name__} {value!r:.40}")
    value = operator.index(value)
    if not low <= value <= MAX_COUNT:
        raise ConfigError(f"{name} must be >= {low}{note} and at most 2**63 - 1, got {value!r:.40}")
    return value


def clip(value: Any) -> float | None:
    """None (no clipping recorded), or the max gradient norm: a finite number above 0."""
    if value is None:
        return None
    x = number(value) if isinstance(value, (int, float)) else (float(value) if isinstance(value, numbers.Real) else None)
    if x is None or isinstance(value, bool) or not (math.isfinite(x) and x > 0):
        raise ConfigError(f"clip must be the max gradient norm the loop clips to, a finite number above 0 (None: "
                          f"no clipping), got {type(value).__name__} {value!r:.40}")
    return value if isinstance(value, (int, float)) else x


def flag(name: str, value: Any) -> bool:
    """True or False (a word such as 'no' would count as True)."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}")
    return value


def callback(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise UsageError(f"{name} must be a function called with each alert dict, or None, got "
                         f"{type(value).__name__} {value!r:.40}")
    return value


def alert_kinds(name: str, value: Any, known: Iterable[str]) -> frozenset:
    """A kind or a list of kinds, each a registered alert kind (a misspelt one would never fire)."""
    if isinstance(value, str):
        value = (value,)
    if value is None or isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be an alert kind or a list of them, got {type(value).__name__} {value!r:.40}")
    kinds = tuple(value)
    known = tuple(known)
    for kind in kinds:
        if not isinstance(kind, str):
            raise UsageError(f"{name} must list alert kinds (strings), got {type(kind).__name__} {kind!r:.40}")
        if kind not in known:
            raise ConfigError(f"{name} names {kind!r:.60}, which no registered detector raises; the kinds are "
                              f"{', '.join(known)}")
    return frozenset(kinds)


def settings(value: Any) -> dict[str, Any]:
    """Extra entries for run.json's settings: names that are not the monitor's own, values that strict
    JSON writes and the readers read back."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"settings must be a dict {{name: value}} for run.json, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise UsageError(f"settings names must be strings, got {type(key).__name__} {key!r:.40}")
        if key in OWN_SETTINGS:
            raise ConfigError(f"settings={{{key!r}: ...}} would overwrite the monitor's own {key!r} in run.json: "
                              f"pass {key}= itself, or another name")
        try:
            _json.loads(_json.dumps(item))  # as run.json is written, and as its readers parse it
        except (TypeError, ValueError, RecursionError) as exc:  # no JSON form, a cycle, nesting too deep
            raise ConfigError(f"settings={{{key!r}: ...}} cannot go into run.json as JSON ({type(exc).__name__}: "
                              f"{str(exc)[:120]}): give a string, a number, a bool, None, or lists and dicts of "
                              f"them") from None
    return dict(value)
