"""How diagnose writes files and reads numbers back, for every front end (the CLI, the report).

Public and torch-free: `check_outputs` refuses an output path that would destroy something before
any work, `atomic_write` writes a file whole or not at all (_write.py); `dumps` / `loads` are the
one strict JSON policy (RFC 8259: NaN and infinities written as null and listed, _json.py); and
`number` / `kind` turn a number read from a file into a float once, or name what it is instead
(_numbers.py). The CLI and the report import these names from here.
"""

from __future__ import annotations

from ._json import dumps, loads
from ._numbers import kind, number
from ._write import atomic_write, check_outputs

__all__ = ["atomic_write", "check_outputs", "dumps", "kind", "loads", "number"]
