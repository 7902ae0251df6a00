"""Progress of a sweep as plain events for a caller's callback; drawing them (a bar) is the CLI's job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError


@dataclass(frozen=True)
class ProgressEvent:
    """`done` of `total` steps of a sweep; `note`, once, says what the sweep chose (micro-batch, heads
    per forward), with the step count unchanged."""

    done: int
    total: int
    note: str | None = None


ProgressCallback = Callable[[ProgressEvent], None]


class Progress:
    """Counts the steps and tells the callback (nothing when there is none)."""

    def __init__(self, callback: ProgressCallback | None):
        if callback is not None and callback is not False and not callable(callback):
            raise UsageError(f"progress must be a callable receiving ProgressEvents (or None), got "
                             f"{callback!r}; the command line draws the bar itself")
        self.callback = callback or None
        self.done = self.n = 0

    def total(self, n: int) -> None:
        self.n = n

    def note(self, text: str) -> None:
        if self.callback is not None:
            self.callback(ProgressEvent(self.done, self.n, text))

    def tick(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(ProgressEvent(self.done, self.n))
