"""Tail a live run folder until its writer closes it (what `diagnose stats --follow` runs).

A writer that was killed never marks its run closed. Each session in run.json records the
writer's pid and host; on the same host a pid that no longer exists ends the tail at once
("writer_gone"). Elsewhere (a shared filesystem) the pid cannot be checked, so after
quiet_s without a new record the tail says so once and keeps waiting.

Ctrl-C is taken by the loop itself (`_ctrl_c`): Python raises KeyboardInterrupt in whatever runs when
the signal lands, and where that is a finaliser (`__del__`, a weakref callback) the exception is
printed as "ignored" and lost, and the follower would follow on forever. The loop checks a flag the
handler sets, at least every poll; a second Ctrl-C raises at once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import RunFolderError
from ._runfolder import RUN_JSON, RunTail, _load_info

CLOSED, WRITER_GONE, TIMEOUT = "closed", "writer_gone", "timeout"


def writer_alive(info: dict[str, Any]) -> bool | None:
    """Whether the last session's writer process still runs: None when that cannot be known
    (no pid recorded, or another host)."""
    sessions = info.get("sessions")
    last = sessions[-1] if isinstance(sessions, list) and sessions and isinstance(sessions[-1], dict) else {}
    pid, host = last.get("pid"), last.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists but belongs to someone else, or cannot be asked: assume alive
    return True


def follow(run_dir: str | os.PathLike, on_step: Callable[[dict[str, Any]], None],
           on_alert: Callable[[dict[str, Any]], None], *, on_note: Callable[[str], None] | None = None,
           poll_s: float = 0.5, wait_s: float = 30.0, quiet_s: float = 30.0,
           timeout_s: float | None = None) -> str:
    """Call on_step / on_alert for every record, old and new, until the run ends.

    Waits up to wait_s for a run that has not written run.json yet (telling on_note so).
    Returns "closed" when run.json says closed, "writer_gone" when the writer's process is
    gone without closing it, "timeout" when timeout_s passed first. on_note gets one-line
    notices (waiting for the run to start; no record for quiet_s; a line that does not parse, once).
    Ctrl-C propagates.
    """
    note = on_note or (lambda _msg: None)
    tail = RunTail(run_dir)
    if not (tail.dir / RUN_JSON).exists():
        note(f"waiting for {tail.dir / RUN_JSON} (the run has not started yet; up to {wait_s:g} s)")
        tail.wait(wait_s, poll_s)
    if not (tail.dir / RUN_JSON).exists():
        raise RunFolderError(f"{run_dir} is not a diagnose run folder (no run.json after {wait_s:g} s): "
                             f"give the folder passed to TrainingMonitor")
    with _ctrl_c() as pressed:
        return _loop(tail, on_step, on_alert, note, poll_s, quiet_s, timeout_s, pressed)


@contextmanager
def _ctrl_c() -> Iterator[Callable[[], None]]:
    """A check that raises KeyboardInterrupt once Ctrl-C was pressed (module docstring); where Python's own
    handler is not the one in place (another thread, the caller's own handler) the check does nothing."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: None
        return
    pressed: list[bool] = []

    def handler(signum, frame) -> None:
        if pressed:  # the second Ctrl-C: at once, wherever it lands
            raise KeyboardInterrupt
        pressed.append(True)

    def check() -> None:
        if pressed:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


def _loop(tail: RunTail, on_step, on_alert, note, poll_s: float, quiet_s: float, timeout_s: float | None,
          pressed: Callable[[], None]) -> str:
    end = None if timeout_s is None else time.monotonic() + timeout_s
    last_news, said_quiet = time.monotonic(), False
    said_skip: list[bool] = []  # the skipped-line note, said once

    def deliver() -> tuple[bool, bool]:
        """Hand on what the run wrote since the last poll: (anything new, run closed)."""
        steps, alerts, closed = tail.poll()
        for rec in steps:
            on_step(rec)
        for alert in alerts:
            on_alert(alert)
        if tail.skipped and not said_skip:
            said_skip.append(True)
            note(f"a line in {tail.dir} does not parse (a torn write, or nesting too deep) and is skipped, as "
                 f"`diagnose stats` skips it; the summary counts the skipped lines")
        return bool(steps or alerts), closed

    while True:
        pressed()
        news, closed = deliver()
        if closed:
            return CLOSED
        now = time.monotonic()
        if news:
            last_news, said_quiet = now, False
        info = _load_info(tail.dir)
        if writer_alive(info) is False:
            if deliver()[1]:  # what it wrote just before it died
                return CLOSED
            pid = info["sessions"][-1]["pid"]
            note(f"the writer (pid {pid}) is gone without closing the run (killed or crashed); stopping")
            return WRITER_GONE
        if not said_quiet and now - last_news > quiet_s:
            note(f"no new record for {quiet_s:g} s: the writer may be stuck, slow, or killed on another "
                 "machine; still following (Ctrl-C stops)")
            said_quiet = True
        if end is not None and now > end:
            return TIMEOUT
        if not tail.more:  # a poll that stopped at its byte budget reads on at once
            time.sleep(poll_s)  # a Ctrl-C wakes it (the handler runs), then the check at the top
