"""Eval mode for the length of an analysis, every module's own training flag restored after."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch.nn as nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """model.eval() (no dropout) inside; each module's flag is put back, so a model the caller
    keeps partly in train mode (e.g. frozen BatchNorm) comes back exactly as it was."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
