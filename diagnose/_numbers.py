"""One conversion of numbers that come from files and options into floats.

JSON allows integers of any length: 10**400 passes `isinstance(x, (int, float))`, then
overflows wherever it meets a float (a plot axis, `int(inf)`, a format). So every reader turns
the numbers it uses into floats here, once, and refuses what a float cannot hold, naming the
field; the code after it sees only floats (or None where a value may be missing).
"""

from __future__ import annotations

import math
from typing import Any


def number(value: Any) -> float | None:
    """float(value) for an int or float (not a bool) that a float can hold, NaN and infinities
    included; None for anything else (None, a string, a list, an integer of 400 digits)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def finite(value: Any) -> float | None:
    """number(value) when it is finite, else None."""
    x = number(value)
    return x if x is not None and math.isfinite(x) else None


def to_float(value: Any) -> float:
    """A float for a value being written (a metric, a size): an integer too large for a float
    becomes an infinity of its sign instead of raising OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def kind(value: Any) -> str:
    """What a value that is not a usable number is, in words, for an error message."""
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an integer too large for a float" if number(value) is None else "an integer"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else ("infinite" if math.isinf(value) else "a number")
    return {type(None): "null", dict: "an object", list: "a list", str: "a string"}.get(
        type(value), f"a {type(value).__name__}")
