"""What the installed torch has: tests of features a newer torch brought skip on the version matrix's
lowest row (docs/development.md) instead of failing there."""

from __future__ import annotations

import torch


def torch_before(major: int, minor: int) -> bool:
    """True on a torch older than major.minor (local tags such as +cpu ignored)."""
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (major, minor)
