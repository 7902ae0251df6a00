"""What TrainingMonitor.step() is given, checked before anything is measured or written (issue 36):
a loss, lr, token or micro-batch count that a float cannot hold, or that is not a number at all, was a
raw OverflowError or ValueError inside the step, or (lr='abc', micro_batches=10**400) was written to
metrics.jsonl, whose readers then refuse the whole run. UsageError for the wrong kind of value,
ConfigError for a number out of range; one line naming the argument."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import torch

from .._numbers import number
from ..errors import ConfigError, UsageError
from ._records import MAX_STEP, check_step


def _scalar(name: str, value: Any, what: str) -> None:
    """None, a number a float holds (NaN and infinities too: they are the news), or a one-element tensor."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise UsageError(f"step({name}=...) must be one number: {what}; got a tensor of shape "
                             f"{list(value.shape)}")
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"step({name}=...) must be a number or a one-element tensor ({what}), got "
                         f"{type(value).__name__} {value!r:.40}")
    if number(value) is None and not isinstance(value, float):  # an integer too large for a float
        raise ConfigError(f"step({name}=...) is an integer too large for a float ({what})")


def _count(name: str, value: Any) -> None:
    if value is None or isinstance(value, torch.Tensor) and value.numel() == 1:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UsageError(f"step({name}=...) must be a whole number, got {type(value).__name__} {value!r:.40}")
    if not 0 <= operator.index(value) <= MAX_STEP:
        raise ConfigError(f"step({name}=...) must be from 0 to 2**63 - 1, got {value!r:.40}")


def check_step_args(current: int, step: Any, *, loss: Any, lr: Any, tokens: Any, micro_batches: Any) -> int:
    """The step number this step() records (`step` when given, else `current`), its arguments checked."""
    _scalar("loss", loss, "the optimizer step's loss")
    if isinstance(lr, (list, tuple)):  # one lr per parameter group
        for x in lr:
            _scalar("lr", x, "one per parameter group")
    else:
        _scalar("lr", lr, "the learning rate")
    _count("tokens", tokens)
    if isinstance(micro_batches, torch.Tensor):
        raise UsageError("step(micro_batches=...) must be a whole number, got a tensor")
    _count("micro_batches", micro_batches)
    return current if step is None else check_step(step)
