"""Reading input files defensively: regular files only, bounded sizes, bounded JSON nesting.

Every reader of user-supplied files goes through here, so that a FIFO never hangs a command,
a symlink to /dev/zero never fills memory, and a hostile JSON document never ends in a
RecursionError. Files that diagnose itself wrote are read the same way (with diagnose._json,
which also accepts the bare NaN / Infinity tokens older versions wrote).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from .. import _json
from ..errors import InputFileError

# Defaults; a caller with a better idea of the size it needs passes its own limit.
MAX_JSON_BYTES = 256 << 20  # a heads JSON of a 70B-class model is a few MB
MAX_LINE_BYTES = 16 << 20  # one JSONL record


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def require_file(path: Path, what: str) -> None:
    """Raise InputFileError unless `path` is an existing regular file (symlinks followed).

    FIFOs, devices and sockets are refused before they are opened: reading a FIFO blocks until
    a writer comes, and a device such as /dev/zero never ends.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file; check the path ({what})") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror}); check the path and its "
                             f"permissions ({what})") from None
    if stat.S_ISDIR(mode):
        raise InputFileError(f"{path}: is a folder, not a file ({what})")
    if not stat.S_ISREG(mode):
        raise InputFileError(f"{path}: is {_kind(mode)}, not a regular file; diagnose reads only regular "
                             f"files: save the {what} to a file and pass that")


def special_kind(path: Path) -> str | None:
    """'a named pipe (FIFO)', 'a character device', ... for an existing non-regular, non-folder path."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind(mode)


def read_bytes(path: Path, what: str, *, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole regular file, refused (before reading) when it is larger than `limit` bytes."""
    require_file(path, what)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise InputFileError(f"{path}: is {size:,} bytes, over the {limit:,} a {what} may have; "
                                     "is this the right file?")
            data = f.read(limit + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror}); check its permissions ({what})") from None
    if len(data) > limit:  # grew while we read it
        raise InputFileError(f"{path}: is over the {limit:,} bytes a {what} may have; is this the right file?")
    return data


def parse_json(text: str | bytes, where: str, fix: str) -> Any:
    """json.loads with every failure -- syntax, encoding, nesting too deep -- as one InputFileError.

    Files diagnose wrote come back as written: a `nonfinite` map restores its NaN / Infinity,
    and the bare NaN / Infinity tokens of older versions are accepted (diagnose._json.loads).
    """
    try:
        return _json.loads(text)
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read; {fix}") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{where}: is not UTF-8 text ({exc.reason}); {fix}") from None
    except _json.TooLargeError as exc:
        raise InputFileError(f"{where}: {exc}; {fix}") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                             f"{fix}") from None
    except ValueError as exc:  # int() of a 5000-digit number, ...
        raise InputFileError(f"{where}: JSON that cannot be read ({' '.join(str(exc).split())[:160]}); "
                             f"{fix}") from None


def read_json(path: Path, what: str, fix: str, *, limit: int = MAX_JSON_BYTES) -> Any:
    """A regular JSON file of at most `limit` bytes, parsed; every failure is one InputFileError."""
    return parse_json(read_bytes(path, what, limit=limit), str(path), fix)


def iter_lines(path: Path, what: str, *, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline) of a regular file, split on b"\\n" only.

    A line longer than `max_line` bytes is refused without being held in memory whole.
    (Python's str.splitlines also splits at U+2028 and other separators, which JSON allows
    inside strings, so it must not be used on JSONL.)
    """
    require_file(path, what)
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(iter(lambda: f.readline(max_line + 1), b""), start=1):
                if len(line) > max_line and not line.endswith(b"\n"):
                    raise InputFileError(f"{path}, line {number}: longer than {max_line:,} bytes; split or "
                                         f"shorten it ({what})")
                yield number, line.rstrip(b"\n").rstrip(b"\r")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror}); check its permissions ({what})") from None
