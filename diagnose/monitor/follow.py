"""Tail a live run folder until its writer closes it (what `diagnose stats --follow` runs)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from ..errors import RunFolderError
from .runfolder import RUN_JSON, RunTail


def follow(run_dir: str | os.PathLike, on_step: Callable[[dict[str, Any]], None],
           on_alert: Callable[[dict[str, Any]], None], *, poll_s: float = 0.5,
           wait_s: float = 30.0, timeout_s: float | None = None) -> bool:
    """Call on_step / on_alert for every record, old and new, until run.json says closed.

    Waits up to wait_s for a run that has not written run.json yet. Returns True when the run
    closed, False when timeout_s passed first. Ctrl-C propagates (KeyboardInterrupt).
    """
    tail = RunTail(run_dir)
    tail.wait(wait_s, poll_s)
    if not (tail.dir / RUN_JSON).exists():
        raise RunFolderError(f"{run_dir} is not a diagnose run folder (no run.json after {wait_s:g} s): "
                             f"give the folder passed to TrainingMonitor")
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        steps, alerts, closed = tail.poll()
        for rec in steps:
            on_step(rec)
        for alert in alerts:
            on_alert(alert)
        if closed:
            return True
        if end is not None and time.monotonic() > end:
            return False
        time.sleep(poll_s)
