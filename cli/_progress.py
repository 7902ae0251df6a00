"""The progress bar of `diagnose heads`: the library reports plain ProgressEvents, the CLI draws them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def progress_bar(label: str, shown: bool = True) -> Iterator[Callable | None]:
    """A callback drawing a rich bar on stderr while the block runs (None when not shown)."""
    if not shown:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def show(event) -> None:
            if event.note is not None:
                if console.is_terminal:  # stays after the bar goes; elsewhere stderr keeps to errors
                    console.print(f"{label}: {event.note}", highlight=False, markup=False)
                bar.update(task, description=event.note)
            bar.update(task, completed=event.done, total=event.total or None)

        yield show
