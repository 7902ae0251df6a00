"""One strict-JSON policy (RFC 8259) for every file diagnose writes.

JSON has no NaN or Infinity. A non-finite float is written as `null` in place, so that
JSON.parse, jq, pandas and typed readers (serde, Go) accept every file unchanged, numeric
columns stay numeric, and plots draw a gap. So that "NaN loss" is not confused with "not
measured", a top-level object that held non-finite numbers also gets a `nonfinite` map from
the JSON Pointer (RFC 6901) of each such value to "NaN", "Infinity" or "-Infinity":

    {"step": 7, "loss": null, "layers": {"blocks.0": {"grad_norm": null}},
     "nonfinite": {"/loss": "NaN", "/layers/blocks.0/grad_norm": "Infinity"}}

`loads` reads both that form (restoring the floats) and older files with bare NaN /
Infinity tokens. It is also where numbers are first seen: an integer no float can hold
(JSON allows 10**400) raises TooLargeError naming its field, so no reader meets one later as an
OverflowError (diagnose._numbers then turns each field it uses into a float).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import DataError

NONFINITE_KEY = "nonfinite"
_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _name(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _pointer_part(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def to_strict(obj: Any) -> tuple[Any, dict[str, str]]:
    """A copy of `obj` with non-finite floats as None, and {JSON Pointer: "NaN"|...} of each.

    Tuples become lists, numpy/torch scalars (anything with .item()) become numbers.
    """
    found: dict[str, str] = {}

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            found[where] = _name(value)
            return None
        if isinstance(value, dict):
            return {str(k): walk(v, f"{where}/{_pointer_part(k)}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{where}/{i}") for i, v in enumerate(value)]
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            return walk(value.item(), where)
        if hasattr(value, "tolist"):
            return walk(value.tolist(), where)
        return value  # left to json.dumps, which raises TypeError for what it cannot write

    return walk(obj, ""), found


def dumps(obj: Any, *, indent: int | None = None, compact: bool = False, **kw: Any) -> str:
    """Strict JSON text of `obj` (see the module docstring for non-finite numbers).

    compact: no spaces (one JSON-lines record). A `nonfinite` key already present at the top
    level is replaced by the one computed here.
    """
    separators = (",", ":") if compact else None
    if not (isinstance(obj, dict) and NONFINITE_KEY in obj):
        try:  # the common case, all finite and plain: no copy (a monitor writes one record per step)
            return json.dumps(obj, indent=indent, separators=separators, allow_nan=False, **kw)
        except (ValueError, TypeError):
            pass  # a NaN/Inf, or a numpy/torch scalar: take the careful path
    clean, found = to_strict(obj)
    if isinstance(clean, dict):
        clean.pop(NONFINITE_KEY, None)
        if found:
            clean[NONFINITE_KEY] = found
    return json.dumps(clean, indent=indent, separators=separators, allow_nan=False, **kw)


def restore(obj: Any) -> Any:
    """Put the floats a `nonfinite` map names back in place (and drop the map); bad entries are ignored."""
    if not isinstance(obj, dict) or not isinstance(obj.get(NONFINITE_KEY), dict):
        return obj
    for pointer, name in obj.pop(NONFINITE_KEY).items():
        if name not in _NAMES or not isinstance(pointer, str) or not pointer.startswith("/"):
            continue
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]
        node: Any = obj
        for part in parts[:-1]:
            node = _child(node, part)
            if node is None:
                break
        else:
            last = parts[-1]
            if isinstance(node, dict) and last in node and node[last] is None:
                node[last] = _NAMES[name]
            elif isinstance(node, list) and last.isdigit() and int(last) < len(node) and node[int(last)] is None:
                node[int(last)] = _NAMES[name]
    return obj


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        value = node.get(part)
    elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
        value = node[int(part)]
    else:
        return None
    return value if isinstance(value, (dict, list)) else None


class TooLargeError(DataError):
    """A JSON integer no float can hold; `field` is where it sits (`heads[1].delta_loss`).

    A DataError (so also a ValueError): the readers name the file, but a caller of loads sees
    a diagnose error too."""

    def __init__(self, field: str, digits: int):
        super().__init__(f"`{field}` is an integer of {digits} digits, too large for a number")
        self.field, self.digits = field, digits


class _Huge(int):
    """An integer parse_int found too large for a float, marked so that its field can be named."""


def _parse_int(text: str) -> int:
    value = int(text)
    if len(text) > 300:  # float() holds up to ~1.8e308 (309 digits); only long ones need the test
        try:
            float(value)
        except OverflowError:
            return _Huge(value)
    return value


def _find_huge(node: Any, where: str) -> tuple[str, int] | None:
    if isinstance(node, _Huge):
        return where or "(the document)", len(str(abs(node)))
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found = _find_huge(value, f"{where}[{key}]" if isinstance(key, int) else
                           f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def loads(text: str | bytes) -> Any:
    """Parse JSON written by any diagnose version: bare NaN/Infinity tokens, or null plus `nonfinite`.

    Raises TooLargeError (a DataError, so a ValueError) for an integer too large for a float."""
    huge: list[bool] = []

    def parse_int(s: str) -> int:
        value = _parse_int(s)
        if isinstance(value, _Huge):
            huge.append(True)
        return value

    obj = json.loads(text, parse_int=parse_int)
    if huge:
        raise TooLargeError(*(_find_huge(obj, "") or ("(the document)", 0)))
    return restore(obj)
