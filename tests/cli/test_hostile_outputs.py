"""Hostile and broken outputs, through the CLI: nothing an output path names may destroy an
input or a special file, a failed write loses no results and leaves no temporary file,
everything written is strict JSON, data on the terminal is text (never markup or escape
sequences), and Ctrl-C is "interrupted" with exit code 130."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose import _json
from diagnose.cli.main import cli
from diagnose.monitor._runfolder import RunWriter
from diagnose.zoo import ModelConfig, Transformer


def _invoke(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def _one_line_error(result, *words, code=2):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for w in words:
        assert w in lines[0], lines[0]


def _strict(text: str):
    """json.loads that fails on the NaN / Infinity extensions (what jq and JSON.parse reject)."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in a file diagnose wrote"))


def _temporaries(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.endswith(".partial"))


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A tiny LM checkpoint, its data, a heads JSON and a closed run folder, in the cwd."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 12, (8, 6))}, tmp_path / "data.pt")
    (tmp_path / "heads.json").write_text(json.dumps({"schema": "diagnose.heads/2", "model": {"family": "x"},
                                                     "heads": []}))
    w = RunWriter(tmp_path / "run", {"settings": {}})
    w.write_step({"step": 0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "layers": {}})
    w.close()
    return tmp_path


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


HEADS = ("heads", "lm.pt", "--data", "data.pt", "--task", "lm")
CHECK = ("check", "lm.pt", "--data", "data.pt")


def _fifo(p):
    os.mkfifo(p)
    return p


def _readonly(p):
    p.write_text("keep me")
    p.chmod(0o444)
    return p


def _hardlink(p):
    os.link(p.parent / "lm.pt", p)
    return p


def _symlink(p):
    p.symlink_to(p.parent / "data.pt")
    return p


# (what, args with {d} for the folder, words in the one-line message)
REFUSED = [
    ("heads --json onto the model", [*HEADS, "--json", "lm.pt"], ["--json", "input"]),
    ("heads --json onto the data", [*HEADS, "--json", "data.pt"], ["--json", "input"]),
    ("heads --html onto the model", [*HEADS, "--html", "lm.pt"], ["--html", "input"]),
    ("heads --json and --html the same file", [*HEADS, "--json", "o.x", "--html", "o.x"], ["same file"]),
    ("check --json onto the model", [*CHECK, "--json", "lm.pt"], ["--json", "input"]),
    ("check --json inside --run folder", [*CHECK, "--run", "run", "--json", "run/c.json"], ["inside the input folder"]),
    ("report -o onto its source", ["report", "heads.json", "-o", "heads.json"], ["-o", "input"]),
    ("report -o onto the training log", ["report", "run", "-o", "run/metrics.jsonl"], ["inside the input folder"]),
    ("report -o a new file in the run folder", ["report", "run", "-o", "run/r.html"], ["inside the input folder"]),
    ("stats --html onto run.json", ["stats", "run", "--html", "run/run.json"], ["inside the input folder"]),
    ("heads --json a character device", [*HEADS, "--json", "/dev/null"], ["character device", "leave out --json"]),
    ("heads --json a FIFO", [*HEADS, "--json", "{fifo}"], ["FIFO"]),
    ("report -o a folder", ["report", "heads.json", "-o", "run"], ["folder"]),
    ("check --json a read-only file", [*CHECK, "--json", "{readonly}"], ["read-only", "chmod u+w"]),
    ("heads --json a hard link to the model", [*HEADS, "--json", "{hardlink}"], ["input"]),
    ("check --json a symlink to the data", [*CHECK, "--json", "{symlink}"], ["input"]),
    ("heads --json under a file", [*HEADS, "--json", "lm.pt/x.json"], ["not a folder"]),
    ("stats --tensorboard into the run folder", ["stats", "run", "--tensorboard", "run/tb"],
     ["inside the input folder"]),
    ("stats --tensorboard onto a file", ["stats", "run", "--tensorboard", "lm.pt"], ["must be a folder"]),
    ("demo --out onto a file", ["demo", "--quick", "--out", "heads.json"], ["must be a folder"]),
    ("heads --json a 300-character name", [*HEADS, "--json", "h" * 295 + ".json"], ["shorter file name"]),
]
MAKERS = {"{fifo}": _fifo, "{readonly}": _readonly, "{hardlink}": _hardlink, "{symlink}": _symlink}


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model, reading a run or running the demo fails the test: an output is refused before
    any work. (A FIFO opened for writing would block the test: none is.)"""
    def work(*args, **kwargs):
        raise AssertionError("work started before the output was refused")

    for name in ("diagnose.io.load_model", "diagnose.monitor.read_run", "diagnose.demo.run_demo"):
        monkeypatch.setattr(name, work)


@pytest.mark.parametrize("what, args, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_output_that_would_destroy_something_is_refused(files, no_work, what, args, words):
    args = [str(MAKERS[a](files / a.strip("{}"))) if a in MAKERS else a for a in args]
    before = _snapshot(files)
    devnull = os.stat("/dev/null")
    result = _invoke(*args)
    _one_line_error(result, *words)
    assert _snapshot(files) == before  # no input replaced, nothing half-written, no temporary left
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.stat("/dev/null").st_ino == devnull.st_ino


def test_leftover_partial_folder_does_not_break_check(files):
    (files / "c.json.partial").mkdir()  # what an old version's fixed temporary name could leave
    result = _invoke(*CHECK, "--json", "c.json")
    assert result.exit_code == 0, result.output
    assert _strict((files / "c.json").read_text())["schema"] == "diagnose.checks/1"
    assert _temporaries(files) == ["c.json.partial"]


def _fail_in(folder, code):
    """A tempfile.mkstemp that fails with `code` in `folder` (the fallback elsewhere still works)."""
    real = tempfile.mkstemp

    def mkstemp(*a, **kw):
        if kw.get("dir") is not None and os.path.samefile(kw["dir"], folder):
            raise OSError(code, os.strerror(code))
        return real(*a, **kw)
    return mkstemp


def _full_disk(monkeypatch, folder):
    """The disk fills up while the output is written: os.fsync of the temporary file raises ENOSPC."""
    real = os.fsync

    def fsync(fd):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == str(folder.resolve()):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)
    monkeypatch.setattr("diagnose._write.os.fsync", fsync)


def _readonly_folder(monkeypatch, folder):
    # a chmod 555 folder stops no one running as root, so the refusal the kernel would give is simulated
    monkeypatch.setattr("diagnose._write.tempfile.mkstemp", _fail_in(folder, errno.EACCES))


FAILED_WRITES = [
    ("heads, disk full", HEADS, "--json", _full_disk, "No space left", "diagnose.heads/2"),
    ("check, disk full", CHECK, "--json", _full_disk, "No space left", "diagnose.checks/1"),
    ("heads, read-only folder", HEADS, "--json", _readonly_folder, "Permission denied", "diagnose.heads/2"),
    ("check, read-only folder", CHECK, "--json", _readonly_folder, "Permission denied", "diagnose.checks/1"),
    ("report, disk full", ("report", "run"), "-o", _full_disk, "No space left", None),
]


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc to tell which file is synced")
@pytest.mark.parametrize("what, args, option, fail, reason, schema", FAILED_WRITES, ids=[f[0] for f in FAILED_WRITES])
def test_failed_write_is_one_line_and_keeps_the_results(files, monkeypatch, what, args, option, fail, reason, schema):
    out = files / "out"
    out.mkdir()
    fail(monkeypatch, out)
    result = _invoke(*args, option, out / "result.json")
    _one_line_error(result, str(out / "result.json"), reason, "saved to")
    assert list(out.iterdir()) == []  # no stale temporary, no half file
    saved = re.search(r"saved to (\S+) instead", result.stderr).group(1)
    try:
        text = open(saved, encoding="utf-8").read()
        head = _strict(text)["schema"] if schema else text[:15]  # the computed results, whole
        assert head == (schema or "<!DOCTYPE html>")
    finally:
        os.unlink(saved)


def test_strict_json_in_every_file_diagnose_writes(tmp_path, monkeypatch):
    """A run with a NaN loss and an Inf gradient: run.json, metrics.jsonl, alerts.jsonl, heads and
    checks JSON, the stats summary and the report's data blob all parse as RFC 8259 JSON, and
    diagnose reads the exact non-finite values back."""
    monkeypatch.chdir(tmp_path)
    w = RunWriter(tmp_path / "run", {"settings": {"clip": math.inf}})
    w.write_step({"step": 0, "loss": 2.0, "lr": 0.1, "grad_norm": 1.0, "layers": {"b/0": {"grad_norm": 1.0}}})
    w.write_step({"step": 1, "loss": math.nan, "lr": 0.1, "grad_norm": math.inf,
                  "layers": {"b/0": {"grad_norm": -math.inf}}})
    w.write_alert({"step": 1, "kind": "nonfinite", "severity": "error", "where": "loss", "message": "NaN",
                   "hint": "-", "value": math.nan})
    w.close()
    for name in ("run.json", "metrics.jsonl", "alerts.jsonl"):
        for line in (tmp_path / "run" / name).read_text().splitlines() if name.endswith("l") else \
                [(tmp_path / "run" / name).read_text()]:
            _strict(line)
    last = _strict((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["loss"] is None and last["nonfinite"] == {
        "/loss": "NaN", "/grad_norm": "Infinity", "/layers/b~10/grad_norm": "-Infinity"}
    run = diagnose.read_run(tmp_path / "run")
    assert math.isnan(run.steps["loss"].iloc[1]) and run.steps["grad_norm"].iloc[1] == math.inf
    assert run.steps["layers/b/0/grad_norm"].iloc[1] == -math.inf
    assert run.info["settings"]["clip"] == math.inf

    summary = _invoke("stats", "run", "--json")
    assert summary.exit_code == 0, summary.output
    assert _strict(summary.stdout)["nonfinite"]["/final_loss"] == "NaN"
    report = _invoke("report", "run", "-o", "r.html")
    assert report.exit_code == 0, report.output
    blob = re.search(r'id="report-data">(.*?)</script>', (tmp_path / "r.html").read_text(), re.S).group(1)
    _strict(blob)

    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=16))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt")
    torch.save({"input_ids": torch.randint(1, 12, (6, 5))}, tmp_path / "d.pt")
    for args in (HEADS[:1] + ("lm.pt", "--data", "d.pt", "--task", "lm", "--json", "h.json"),
                 ("check", "lm.pt", "--data", "d.pt", "--json", "c.json")):
        result = _invoke(*args)
        assert result.exit_code == 0, result.output
    _strict((tmp_path / "h.json").read_text())
    _strict((tmp_path / "c.json").read_text())


def test_old_files_with_bare_nan_tokens_still_read(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "run.json").write_text('{"schema": "diagnose.run/1", "settings": {}, "sessions": [], "closed": true}')
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity}\n')
    steps = diagnose.read_run(run).steps
    assert math.isnan(steps["loss"][0]) and steps["grad_norm"][0] == math.inf and steps["lr"][0] == -math.inf
    result = _invoke("stats", run)
    assert result.exit_code == 0 and "final loss NaN" in result.output, result.output


HOSTILE = ["[/bold] closes nothing", "[/red]", "[link=https://evil.example]click[/link]",
           "\x1b]8;;https://evil.example\x1b\\osc8\x1b]8;;\x1b\\", "\x1b[2J\x1b[31mred\x07", "\u202egnp.exe"]


def _hostile_run(path):
    w = RunWriter(path, {"settings": {}, "model": {"class": "[/bold]", "blocks": ["[/red]block"]}})
    w.write_step({"step": 0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0,
                  "layers": {"[/red]block": {"grad_norm": 1.0}}})
    for i, text in enumerate(HOSTILE):
        w.write_alert({"step": 0, "kind": text, "severity": "error", "where": text, "message": text, "hint": text})
    w.close()
    return path


def _escapes(out: str) -> list[str]:
    """Escape sequences other than rich's own colour codes (SGR, ESC [ ... m)."""
    return re.findall(r"\x1b(?!\[[0-9;]*m)", out) + [c for c in out if c in "\x07\u202e"]


@pytest.mark.parametrize("follow", [False, True], ids=["stats", "stats --follow"])
def test_markup_and_escapes_from_data_print_as_text(tmp_path, follow):
    run = _hostile_run(tmp_path / "run")
    args = ["stats", run] + (["--follow"] if follow else [])
    result = _invoke(*args, env={"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = result.output
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    for text in ("[/bold] closes nothing", "[link=https://evil.example]click[/link]", "[/red]block", "gnp.exe"):
        assert text in plain, text
    assert "\x1b]8;" not in out and not _escapes(out)  # no OSC-8 hyperlink, no raw ESC/BEL/RLO
    assert "\x1b[" in out  # the colours are still rich's own: the test really ran with a terminal


def test_markup_in_messages_of_errors_is_text(tmp_path):
    bad = tmp_path / "[red]x\x1b[2J"
    result = _invoke("stats", bad)
    _one_line_error(result, "[red]x")
    assert "\x1b" not in result.stderr


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt


INTERRUPTED = [
    ("heads", HEADS, "diagnose.io.load_model"),
    ("check", CHECK, "diagnose.io.load_model"),
    ("info", ("info", "lm.pt"), "diagnose.io.load_model"),
    ("stats", ("stats", "run"), "diagnose.monitor.read_run"),
    ("stats --follow", ("stats", "run", "--follow"), "diagnose.monitor.follow"),
    ("report", ("report", "run"), "diagnose.reports.write_report"),
]


@pytest.mark.parametrize("what, args, target", INTERRUPTED, ids=[i[0] for i in INTERRUPTED])
def test_ctrl_c_is_interrupted_and_130(files, monkeypatch, what, args, target):
    monkeypatch.setattr(target, _interrupt)
    result = _invoke(*args)
    assert result.exit_code == 130, result.output
    assert result.stderr.strip() == "interrupted" and "Aborted" not in result.output


def test_ctrl_c_in_the_installed_command_is_interrupted_and_130(files):
    """A real SIGINT to `python -m diagnose stats --follow` on a run that never closes."""
    import signal

    w = RunWriter(files / "live", {"settings": {}})  # open, and its writer (this process) alive
    w.write_step({"step": 0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "layers": {}})
    # SIGINT as a terminal gives it: a suite started in the background (`&` in a script) passes SIGINT on
    # ignored, and a process that ignores it has no Ctrl-C to answer
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "stats", "live", "--follow"], cwd=files,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().startswith("step 0")  # following now, deep inside the command
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_follow_stops_when_the_writer_is_gone(tmp_path, monkeypatch):
    run = tmp_path / "run"
    w = RunWriter(run, {"settings": {}})
    w.write_step({"step": 0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "layers": {}})
    info = json.loads((run / "run.json").read_text())
    assert info["sessions"][-1]["pid"] == os.getpid() and info["sessions"][-1]["host"] == socket.gethostname()
    info["sessions"][-1]["pid"] = _dead_pid()  # as if the training process had been killed
    (run / "run.json").write_text(json.dumps(info))
    slept = []
    monkeypatch.setattr("diagnose.monitor._follow.time.sleep", slept.append)  # the first poll sees it gone
    result = _invoke("stats", run, "--follow")
    assert slept == []
    assert result.exit_code == 0, result.output
    assert "is gone without closing the run" in result.stderr
    assert "open (still running, or killed)" in result.stdout and "step 0" in result.stdout


def test_follow_on_a_folder_not_there_yet_says_it_waits(tmp_path):
    run = tmp_path / "later"

    def start():
        time.sleep(1.0)
        w = RunWriter(run, {"settings": {}})
        w.write_step({"step": 0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "layers": {}})
        w.close()
    t = threading.Thread(target=start)
    t.start()
    try:
        result = _invoke("stats", run, "--follow")
    finally:
        t.join()
    assert result.exit_code == 0, result.output
    assert "waiting for" in result.stderr and "has not started yet" in result.stderr


def test_check_and_heads_print_names_from_the_model_as_text(capsys, monkeypatch):
    """Module names, titles and reasons can come from the user's model: shown as written."""
    from types import SimpleNamespace

    from diagnose.checks._finding import Finding, Findings
    from diagnose.cli import check as check_cli
    from diagnose.cli import heads as heads_cli
    from diagnose.schema import Field, Section

    monkeypatch.setenv("FORCE_COLOR", "1")
    hostile = "[/bold][link=https://evil.example]x\x1b]8;;https://evil.example\x07\u202e"
    findings = Findings([Finding("causal", "error", hostile, {hostile: 1.0}, fix=hostile)],
                        model={"family": hostile, "probe": {"data": hostile}}, passed=[hostile],
                        skipped=[{"check": hostile, "why": hostile}])
    check_cli._print(findings, hostile)
    result = SimpleNamespace(
        model={"family": hostile, "n_layers": 1}, task="lm", method="zero", n_examples=2, n_units=2,
        baseline={"accuracy": 0.5, "loss": 1.0}, heads=[], ranked=lambda: [], significance={
            "n_significant": 0, "n_tested": 0, "correction": "holm", "alpha": 0.05}, fast=None,
        flags=[{"kind": hostile, "layer": 0, "head": 0, "reason": hostile}], together=[],
        timing={"seconds": 1.0, "forward_passes": 2},
        sections=[Section("toy", hostile, (Field("x", hostile, "s"),), [{"x": hostile}], note=hostile)])
    heads_cli._print(result, hostile)
    out = capsys.readouterr().out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert plain.count("[/bold][link=https://evil.example]x]8;;https://evil.example") >= 8
    assert "\x1b]8;" not in out and not _escapes(out) and "\x1b[" in out
