"""Progress of a sweep as plain events for a caller's callback, and the words for them.

The engine reports ProgressEvents (steps done of the total, forward passes so far); drawing a bar is the
CLI's job. `ProgressLog` turns the events into plain lines for an output that is not a terminal (a log
file, a CI job): one every few seconds, with the time left estimated once the first batch is done. Its
clock is passed in, so that what it writes can be tested without reading one.

A run has stages: the sweep first (its events name no stage), then the passes after it (direct effects,
attention statistics, heads closed together, analyses), each announced by `Progress.stage` with its own step
count (or none), so that a long stage is never silent and the time left is the stage's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError

LOG_EVERY = 5.0  # seconds between two lines of ProgressLog


@dataclass(frozen=True)
class ProgressEvent:
    """`done` of `total` steps of a sweep (a step: one head ablated on one batch, or one batch's data or clean
    pass); `note`, once, says what the sweep chose (micro-batch, heads per forward), with the step count
    unchanged. `forwards`: forward passes so far. `first`: the steps of the first batch, after which the time
    left can be estimated (None: unknown). `stage`: which stage after the sweep (its steps counted from 0;
    total 0: a stage counted in no steps)."""

    done: int
    total: int
    note: str | None = None
    forwards: int | None = None
    first: int | None = None
    stage: str | None = None  # the stage after the sweep these steps count (None: the sweep itself)


ProgressCallback = Callable[[ProgressEvent], None]


class Progress:
    """Counts the steps and tells the callback (nothing when there is none)."""

    def __init__(self, callback: ProgressCallback | None):
        if callback is not None and callback is not False and not callable(callback):
            raise UsageError(f"progress must be a callable receiving ProgressEvents (or None), got "
                             f"{callback!r}; the command line draws the bar itself")
        self.callback = callback or None
        self.done = self.n = 0
        self.first: int | None = None
        self.name: str | None = None  # the stage after the sweep (None: the sweep)
        self.forwards: Callable[[], int] | None = None  # reads the forward passes so far

    def total(self, n: int, first: int | None = None) -> None:
        self.n, self.first = n, first

    def stage(self, name: str, n: int = 0, first: int | None = None) -> None:
        """A stage after the sweep begins: `n` steps of its own (0: counted in none), the time left after `first`."""
        self.name, self.done, self.n, self.first = name, 0, n, first
        if self.callback is not None:
            self.callback(self._event())

    def note(self, text: str) -> None:
        if self.callback is not None:
            self.callback(self._event(text))

    def tick(self, n: int = 1) -> None:
        """n more steps done (Sweep.ablate: the heads of one layer on one batch)."""
        self.done += n
        if self.callback is not None:
            self.callback(self._event())

    def _event(self, note: str | None = None) -> ProgressEvent:
        return ProgressEvent(self.done, self.n, note, None if self.forwards is None else self.forwards(), self.first,
                             self.name)


def time_left(event: ProgressEvent, elapsed: float) -> float | None:
    """Seconds left at the pace so far, once the first batch is done (else None)."""
    if event.first is None or not event.total or event.done < max(event.first, 1) or event.done >= event.total:
        return None
    return elapsed / event.done * (event.total - event.done)


def describe(event: ProgressEvent, elapsed: float, in_stage: float | None = None) -> str:
    """'540/1080 steps (50%), 3210 forward passes, 2m10s elapsed, about 2m10s left'; a stage after the sweep
    leads with its name ('direct effects: 3/9 steps (33%), ...'), its time left from `in_stage` seconds."""
    parts = [f"{event.done}/{event.total} steps" + (f" ({event.done / event.total:.0%})" if event.total else "")]
    if event.stage is not None and not event.total:
        parts = []
    if event.forwards is not None:
        parts.append(f"{event.forwards} forward passes")
    parts.append(f"{duration(elapsed)} elapsed")
    left = time_left(event, elapsed if in_stage is None else in_stage)
    if left is not None:
        parts.append(f"about {duration(left)} left")
    return (f"{event.stage}: " if event.stage is not None else "") + ", ".join(parts)


def duration(seconds: float) -> str:
    """'42s', '2m10s', '1h05m'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLog:
    """A ProgressCallback writing plain lines: `label: <note>; <describe>`. The first line comes with the first
    step done after `every` seconds, then one at most every `every` seconds, and `finish()` writes the last
    (the totals), which only closes a log that was started: a sweep done within `every` seconds writes
    nothing at all, so a quick run stays silent and an error after it (a failed write) stays one line.
    Nothing is written before a step is done, so a sweep that fails at once leaves only its error. A new stage
    closes the one before (its last line, if the log was started) and is written at once once the run has
    lasted `every` seconds, so a person waiting sees which stage the time goes to."""

    def __init__(self, write: Callable[[str], None], label: str, clock: Callable[[], float],
                 every: float = LOG_EVERY):
        self.write, self.label, self.clock, self.every = write, label, clock, every
        self.start: float | None = None
        self.last: float | None = None
        self.event: ProgressEvent | None = None
        self.notes: list[str] = []
        self.pending = False  # an event not written yet
        self.stage_start: float | None = None  # when the current stage after the sweep began

    def __call__(self, event: ProgressEvent) -> None:
        now = self.clock()
        if self.start is None:
            self.start = now
        if self.event is not None and event.stage != self.event.stage:
            self.finish()  # the stage before, closed by its last line
            self.stage_start = now
            self.event, self.pending = event, True
            if now - self.start >= self.every:
                self._line(now)
            return
        self.event, self.pending = event, True
        if event.note is not None:
            self.notes.append(event.note)
            return
        if now - (self.last if self.last is not None else self.start) >= self.every:
            self._line(now)

    def finish(self) -> None:
        """The last line (the totals), once a line was written and unless the last event was written already."""
        if self.pending and self.last is not None:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        head = "; ".join(self.notes)
        self.notes = []
        in_stage = None if self.event.stage is None or self.stage_start is None else now - self.stage_start
        self.write(f"{self.label}: " + (f"{head}; " if head else "") + describe(self.event, now - self.start, in_stage))
        self.last, self.pending = now, False
