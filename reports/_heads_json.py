"""Reading a report source whose kept attention maps would not fit in memory as Python lists.

A heads JSON keeps a few examples' maps, `examples[i].attention`, nested [layer][head][Tq][Tk].
For a 70B-class model (80 x 64 heads) three 32-token examples are 16 million numbers, about
340 MB of indented JSON: `json.loads` would make a 24-byte float object and an 8-byte list slot
of each, two gigabytes and more. Here each such array is cut out of the bytes before the
document is parsed, and parsed one layer at a time (a [H][Tq][Tk] slice, a few MB as Python
objects) into one float32 array [L, H, Tq, Tk]; the rest of the document is parsed as usual.

Anything that does not look exactly like such an array (another nesting, ragged rows, a token
in between that is not a number) is left in place for the ordinary parser and its checks, so
this is only a faster path to the same data, never a more lenient one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from diagnose.errors import InputFileError
from diagnose.io import parse_json

# An example's maps: per-head `attention` is an object ({...}); a list after the key is maps.
_MAPS = re.compile(rb'"attention"\s*:\s*\[\s*(?=\[)')
_LAYER_END = re.compile(rb"\]\s*\]\s*\]")  # closes one layer's [H][Tq][Tk]
_WS = re.compile(rb"\s*")
_NOT_NUMBERS = (b'"', b"{", b"t", b"f", b"I", b"N")  # strings, objects, true/false, bare Infinity/NaN
_PLACEHOLDER = "\x00diagnose-map-{}"
REST_LIMIT = 256 << 20  # what is left once the maps are cut out is parsed as usual: the usual bound
FILE_LIMIT = 1 << 30  # maps included: read as bytes and float32 arrays, about 1.5 bytes of memory per byte


def _layer(raw: bytes, start: int) -> tuple[np.ndarray, int] | None:
    """One layer's [H, Tq, Tk] parsed from raw[start:], and where it ends; None when it is not one."""
    end = _LAYER_END.search(raw, start)
    if end is None:
        return None
    text = raw[start:end.end()]
    if any(c in text for c in _NOT_NUMBERS):  # quicker than a regex over every byte
        return None
    try:
        nested = json.loads(text.replace(b"null", b"NaN"))  # the writer turns NaN into null
        arr = np.asarray(nested, dtype=np.float32)  # ragged rows raise ValueError
    except (ValueError, TypeError):
        return None
    return (arr, end.end()) if arr.ndim == 3 else None


def _maps(raw: bytes, start: int) -> tuple[np.ndarray, int] | None:
    """The array [L, H, Tq, Tk] whose first layer begins at raw[start] and the offset after its
    closing bracket; None when the bytes there are anything else."""
    layers, pos = [], start
    while True:
        got = _layer(raw, pos)
        if got is None or (layers and got[0].shape != layers[0].shape):
            return None
        layers.append(got[0])
        pos = _WS.match(raw, got[1]).end()
        sep = raw[pos:pos + 1]
        if sep == b"]":
            return np.stack(layers), pos + 1  # [L, H, Tq, Tk]
        if sep != b",":
            return None
        pos = _WS.match(raw, pos + 1).end()


def _put_back(node: Any, found: dict[str, np.ndarray]) -> None:
    """Each placeholder under examples[i].attention replaced by its array (others stay strings, and
    the source checks refuse them where a number or object belongs)."""
    examples = node.get("examples") if isinstance(node, dict) else None
    for ex in examples if isinstance(examples, list) else []:
        if isinstance(ex, dict) and isinstance(ex.get("attention"), str) and ex["attention"] in found:
            ex["attention"] = found.pop(ex["attention"])


def parse_source(raw: bytes, where: str, fix: str) -> Any:
    """The document in `raw`, with every example's attention maps as a float32 ndarray [L, H, Tq, Tk]."""
    pieces, found, pos = [], {}, 0
    for m in _MAPS.finditer(raw):
        if m.start() < pos:
            continue  # inside a map already cut out
        got = _maps(raw, m.end())
        if got is None:
            continue
        key = _PLACEHOLDER.format(len(found))
        pieces += [raw[pos:m.start()], b'"attention":', json.dumps(key).encode("ascii")]
        found[key], pos = got
    rest = b"".join([*pieces, raw[pos:]]) if found else raw
    if len(rest) > REST_LIMIT:
        besides = " besides its attention maps" if found else ""
        raise InputFileError(f"{where}: is {len(rest):,} bytes{besides}, over the {REST_LIMIT:,} a report source "
                             "may have; is this the right file?")
    del raw
    data = parse_json(rest, where, fix)
    _put_back(data, found)
    return data
