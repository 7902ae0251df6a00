"""Where the monitor gets the input it finds attention and blocks with: a family adapter needs none
(it reads the modules), the generic tracer needs the model's real arguments, which the monitor takes
from the first forward of the training loop itself (a forward pre-hook), never a guessed shape.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from ..adapters._trace import Called


def structural_sites(model: nn.Module) -> bool:
    """Whether a registered or built-in family adapter finds the model's attention without a forward."""
    from ..adapters._registry import adapters

    for adapter in adapters():
        try:
            if adapter.find(model):
                return True
        except Exception as exc:  # noqa: BLE001 - said once; the first forward's tracer takes over
            warnings.warn(f"diagnose: adapter {getattr(adapter, 'family', adapter)!r} failed on "
                          f"{type(model).__name__} ({type(exc).__name__}: {exc}); the monitor traces the first "
                          "forward instead", RuntimeWarning, stacklevel=4)
    return False


class FirstForward:
    """A forward pre-hook on the model as the user calls it (the compiled or DDP wrapper: it runs
    eagerly, outside dynamo's graph) that removes itself and hands the first call's arguments to
    `setup(Called(args, kwargs), args, kwargs)` before that forward runs, so it is measured too."""

    def __init__(self, model: nn.Module, setup: Callable[..., None]):
        self.setup = setup
        self.handle: RemovableHandle | None = model.register_forward_pre_hook(self._first, with_kwargs=True)

    @torch.compiler.disable  # a model compiled after the monitor was made: run this eagerly, once
    def _first(self, _module: nn.Module, args: tuple, kwargs: dict) -> Any:
        self.remove()
        self.setup(Called(tuple(args), dict(kwargs)), args, kwargs)
        return None

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def wait_for_first_forward(model: nn.Module, setup: Callable[..., None]) -> FirstForward:
    return FirstForward(model, setup)
