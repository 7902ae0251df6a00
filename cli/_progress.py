"""The progress of `diagnose heads` and `diagnose circuit`: the library reports plain ProgressEvents, the CLI
shows them: a rich bar with the time left on a terminal, else a plain line on stderr every few seconds (a log
file, a CI job). Each stage after the sweep (direct effects, attention statistics, ...) names itself."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

CLOCK: Callable[[], float] = time.monotonic  # what the progress reads (a test sets its own)


@contextmanager
def progress_bar(label: str, shown: bool = True) -> Iterator[Callable | None]:
    """A callback showing the progress on stderr while the block runs (None when not shown)."""
    clock = CLOCK
    if not shown:
        yield None
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        import click

        from diagnose.ablation.progress import ProgressLog

        log = ProgressLog(lambda line: click.echo(line, err=True), label, clock)
        yield log
        log.finish()  # the totals of a log that was started (a quick sweep writes none; an error, only its line)
        return
    with _bar(console, label, clock) as show:
        yield show


@contextmanager
def _bar(console, label: str, clock: Callable[[], float]) -> Iterator[Callable]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from diagnose.ablation.progress import duration, time_left

    start = clock()
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)
        chose, stage, began = [""], [None], [start]

        def show(event) -> None:
            if event.note is not None:
                console.print(f"{label}: {event.note}", highlight=False, markup=False)  # stays after the bar goes
                chose[0] = event.note
            if event.stage != stage[0]:  # a stage after the sweep: its own count and time left
                stage[0], began[0] = event.stage, clock()
            left = time_left(event, clock() - began[0])
            text = chose[0] if left is None else f"about {duration(left)} left; {chose[0]}"
            text = text if event.stage is None else f"{event.stage}" + (f", about {duration(left)} left" if left else "")
            bar.update(task, completed=event.done, total=event.total or None, description=text)

        yield show
