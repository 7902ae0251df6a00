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

_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


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


def torch_load(path: Path, *, trust_pickle: bool = False, what: str = "model file") -> Any:
    """torch.load with weights_only=True; a pickle that needs classes is refused unless trusted.

    Unpickling can run any code the file names, so a full load happens only with trust_pickle.
    """
    require_file(path, what)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # protocol notices would break the one-line CLI output
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        needed = _GLOBAL.search(str(exc))
        if needed is None:
            raise InputFileError(f"{path}: not a file torch.load can read ({_short(exc)}); "
                                 "write it with torch.save or diagnose.save_checkpoint") from None
        if not trust_pickle:
            raise UnsafePickleError(
                f"{path}: is a pickle that needs {needed.group(1)}, not just tensors; unpickling runs code "
                "from the file, so diagnose refuses it: pass --trust-pickle (trust_pickle=True) only for files "
                "you trust, or save model.state_dict() and load it with --factory module:function") from None
    except Exception as exc:  # zip and storage errors come as RuntimeError, EOFError, OSError, ...
        raise InputFileError(f"{path}: not a file torch.load can read ({_short(exc)}); "
                             "write it with torch.save or diagnose.save_checkpoint") from None
    return _load_trusted(path)


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
