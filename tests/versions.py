"""What the installed torch has: tests of features a newer torch brought skip on the version matrix's
lowest row (docs/development.md) instead of failing there. And what CI must have: a library the
`test` extra installs on every row fails a test under CI when it is missing, and skips it elsewhere."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch


def torch_before(major: int, minor: int) -> bool:
    """True on a torch older than major.minor (local tags such as +cpu ignored)."""
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (major, minor)


def in_ci() -> bool:
    """CI systems set CI=true (GitHub, GitLab, ...; .ci/run sets it too)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> None:
    """In CI a missing requirement fails the run; on a user's machine the test skips, saying why."""
    if in_ci():
        pytest.fail(f"CI is set and {reason}: these tests must run in CI", pytrace=False)
    pytest.skip(reason)


def required(module: str, install: str) -> ModuleType:
    """`module`, which the `test` extra installs (make test, every row of make versions): imported,
    or missing() with how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"{module} is not installed ({install})")
