"""follow(): a killed writer ends the tail; a quiet one is reported once; a late one is waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from diagnose.monitor._follow import CLOSED, TIMEOUT, WRITER_GONE, follow, writer_alive
from diagnose.monitor._runfolder import RunWriter


def _step(w, step):
    w.write_step({"step": step, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "layers": {}})


def _set_session(run, **fields):
    info = json.loads((run / "run.json").read_text())
    info["sessions"][-1].update(fields)
    (run / "run.json").write_text(json.dumps(info))


def test_quiet_writer_is_reported_once_and_followed_on(tmp_path):
    w = RunWriter(tmp_path, {"settings": {}})  # this process: alive
    _step(w, 0)
    notes, steps = [], []
    end = follow(tmp_path, steps.append, lambda a: None, on_note=notes.append, poll_s=0.05, quiet_s=0.3,
                 timeout_s=1.0)
    assert end == TIMEOUT and [s["step"] for s in steps] == [0]
    assert len(notes) == 1 and "no new record for 0.3 s" in notes[0]
    w.close()
    assert follow(tmp_path, steps.append, lambda a: None, poll_s=0.05) == CLOSED


def test_dead_writer_ends_the_tail(tmp_path):
    w = RunWriter(tmp_path, {"settings": {}})
    _step(w, 0)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    _set_session(tmp_path, pid=proc.pid)
    notes = []
    assert follow(tmp_path, lambda r: None, lambda a: None, on_note=notes.append, poll_s=0.05) == WRITER_GONE
    assert f"pid {proc.pid}" in notes[-1]


def test_writer_on_another_host_or_without_pid_cannot_be_judged(tmp_path):
    assert writer_alive({"sessions": [{"pid": os.getpid(), "host": "elsewhere.invalid"}]}) is None
    assert writer_alive({"sessions": [{"started": "x"}]}) is None
    assert writer_alive({"sessions": "garbage"}) is None
    assert writer_alive({}) is None


def test_a_ctrl_c_that_lands_where_it_is_lost_still_stops_the_follower(tmp_path):
    """Python raises KeyboardInterrupt in whatever runs when SIGINT lands; in a finaliser it is printed as
    'ignored' and lost (simulated: the callback swallows it). The loop checks the press itself."""
    import signal

    import pytest

    w = RunWriter(tmp_path, {"settings": {}})  # this process: alive, the run never closes
    _step(w, 0)

    def lossy(_record):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:  # where a finaliser would lose it
            pass

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (a job started
    try:  # with & in a script inherits SIGINT ignored, and then there is no Ctrl-C to take)
        with pytest.raises(KeyboardInterrupt):
            follow(tmp_path, lossy, lambda a: None, poll_s=0.05, timeout_s=5.0)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back
    finally:
        signal.signal(signal.SIGINT, inherited)
        w.close()
