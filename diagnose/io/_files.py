"""Helpers shared by the model and data loaders: safe torch.load, one-line messages, cwd on sys.path."""

from __future__ import annotations

import os
import pickle
import re
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import InputFileError, UnsafePickleError
from ._read import require_file

__all__ = ["cwd_on_path", "one_line", "require_file", "torch_load"]

_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def one_line(exc: BaseException, limit: int = 240) -> str:
    """An exception's message on one line, shortened (library errors span many lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextmanager
def cwd_on_path() -> Iterator[None]:
    """Let `import` find the user's own modules in the current folder, as `python -m` would.

    The `diagnose` console script starts with its bin/ folder on sys.path, not the cwd. No
    __pycache__ is written meanwhile: reading files must leave the user's folders as they were.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path
    no_bytecode = sys.dont_write_bytecode
    if added:
        sys.path.insert(0, cwd)
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = no_bytecode
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def torch_load(path: Path, *, trust_pickle: bool = False, what: str = "model file",
               can_trust: bool = True) -> Any:
    """torch.load with weights_only=True; a pickle that needs classes is refused unless trusted.

    Unpickling can run any code the file names, so a full load happens only with trust_pickle.
    can_trust: whether --trust-pickle applies to this file (model files); the refusal says so.
    torch's own message advises weights_only=False; it is never passed on.
    """
    require_file(path, what)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # protocol notices would break the one-line CLI output
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _refused_by_weights_only(exc, path)
        if reason is None:
            raise InputFileError(f"{path}: not a file torch.load can read ({_short(exc)}); "
                                 "write it with torch.save or diagnose.save_checkpoint") from None
        if not (trust_pickle and can_trust):
            fix = ("pass --trust-pickle (trust_pickle=True) only for files you trust, or save model.state_dict() "
                   "and load it with --factory module:function") if can_trust else \
                "save plain tensors instead: torch.save({'input_ids': ids, 'labels': labels}, path)"
            raise UnsafePickleError(f"{path}: is a pickle that {reason}, not just tensors; unpickling runs code "
                                    f"from the file, so diagnose refuses it: {fix}") from None
    except Exception as exc:  # zip and storage errors come as RuntimeError, EOFError, OSError, ...
        raise InputFileError(f"{path}: not a file torch.load can read ({_short(exc)}); "
                             "write it with torch.save or diagnose.save_checkpoint") from None
    return _load_trusted(path)


def _refused_by_weights_only(exc: BaseException, path: Path) -> str | None:
    """What a weights-only load refused ("needs posix.system", ...), or None for a damaged file."""
    text = str(exc)
    needed = _GLOBAL.search(text)
    if needed:
        return f"needs {needed.group(1)}"
    if "Weights only load failed" not in text and "WeightsUnpickler" not in text:
        return None
    with open(path, "rb") as f:
        head = f.read(2)
    if head[:1] != b"\x80" and head != b"PK":  # neither a pickle (PROTO opcode) nor a torch zip: garbage
        return None
    detail = text.split("WeightsUnpickler error:", 1)[1] if "WeightsUnpickler error:" in text else ""
    detail = " ".join(detail.split("Check the documentation", 1)[0].split())[:120]
    return f"uses more than a weights-only load allows ({detail})" if detail else \
        "uses more than a weights-only load allows"


def _load_trusted(path: Path) -> Any:
    try:
        with cwd_on_path(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # the pickle's own code can raise anything
        raise InputFileError(f"{path}: could not unpickle it ({type(exc).__name__}: {one_line(exc)}); "
                             "the classes it names must be importable: run diagnose from the folder "
                             "that holds their module") from None


def _short(exc: BaseException) -> str:
    """torch's weights-only errors bury the reason under advice; keep just the reason."""
    text = str(exc)
    for marker in ("WeightsUnpickler error:", "PytorchStreamReader"):
        if marker in text:
            rest = text.split(marker, 1)[1] if marker.endswith(":") else marker + text.split(marker, 1)[1]
            return " ".join(rest.split())[:160] or type(exc).__name__
    return one_line(exc)
