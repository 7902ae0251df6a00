"""`diagnose stats` on run folders a user or an attacker edited (issue 36), through the real command:
run.json's `signals` checked as its other fields are, a --tensorboard folder that cannot be made,
--follow saying once that it skipped a line that does not parse, and the TensorBoard export walking
every declared field (the output logits' z, the attention logits' max, the sinks' time) of a real run.
A refusal is exit 2 and one line naming the file, no traceback, the run folder left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.monitor import Sink, read_run, record_fields

from ..monitor.hostile_runs import train
from .hostile import assert_refused, edit_info, invoke, run_folder, tree

pytestmark = pytest.mark.numerics

SIGNALS = [("signals a word", edit_info(signals="all"), "`signals`"),
           ("signals.model an object", edit_info(signals={"model": {"loss": 1}}), "`signals.model`"),
           ("signals.attention a list", edit_info(signals={"attention": ["entropy"]}), "`signals.attention`"),
           ("signals.layers of numbers", edit_info(signals={"layers": {"blocks.0": [1, 2]}}), "`signals.layers`")]


@pytest.mark.parametrize("what, edit, words", SIGNALS, ids=[c[0] for c in SIGNALS])
def test_run_json_signals_are_checked_as_its_other_fields(tmp_path, what, edit, words):
    run = run_folder(tmp_path, edit)
    before = tree(run)
    for args in (["stats", run], ["stats", run, "--json"], ["stats", run, "--follow"]):
        assert_refused(invoke(*args), "run.json", words)
    assert tree(run) == before


def test_a_tensorboard_folder_that_cannot_be_made_is_one_line(tmp_path):
    pytest.importorskip("tensorboard")
    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc, where no folder can be made")
    run = run_folder(tmp_path, lambda run: None)
    before = tree(run)
    res = invoke("stats", run, "--tensorboard", "/proc/diagnose-none/tb")  # passes the path checks, fails in mkdir
    assert_refused(res, "--tensorboard", "/proc/diagnose-none/tb", fix="give a folder you can write")
    assert tree(run) == before


def test_follow_says_once_that_it_skipped_lines_that_do_not_parse(tmp_path):
    def edit(run: Path):
        with open(run / "metrics.jsonl", "a") as f:
            f.write("[" * 200_000 + "]" * 200_000 + "\n" + "{torn\n")  # nesting too deep, then a torn line
    run = run_folder(tmp_path, edit)
    res = invoke("stats", run, "--follow")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    notes = [line for line in res.stderr.splitlines() if "does not parse" in line]
    assert len(notes) == 1 and "skipped" in notes[0], res.stderr
    assert "2 torn line(s) skipped" in res.output  # the summary counts both, as plain `stats` does


def test_the_tensorboard_export_holds_every_declared_field_of_a_real_run(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tmp_path / "run", [Sink()], every=1)  # a real monitored run, with a sink: sink_time is written
    res = invoke("stats", tmp_path / "run", "--tensorboard", tmp_path / "tb")
    assert res.exit_code == 0, res.output
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    last = read_run(tmp_path / "run").records[-1]
    shown = [f.key for f in record_fields("model") if "tensorboard" in f.show and isinstance(last.get(f.key), float)]
    assert {"z_mean", "z_abs_max", "z_sq_mean", "sink_time", "step_time"} <= set(shown)
    assert set(shown) <= tags
    sites = list(last["attention"])
    assert sites and all(f"attention/{s}/max_logit/head{h}" in tags for s in sites for h in range(2))


def test_follow_refuses_a_huge_sparse_file_as_stats_does(tmp_path):
    def edit(run: Path):
        with open(run / "metrics.jsonl", "r+b") as f:
            f.truncate(2 << 30)  # 2 GB of zero bytes after the records, held by no disk block
    run = run_folder(tmp_path, edit)
    for args, words in ((["stats", run], "longer than 16,777,216 bytes"),
                        (["stats", run, "--follow"], "is longer than 16,777,216 bytes")):  # read 64 MiB, not 2 GB
        assert_refused(invoke(*args), "metrics.jsonl", words)


def test_follow_reads_a_file_past_its_poll_budget_whole(tmp_path, monkeypatch):
    from diagnose.monitor import _runfolder, follow

    run = run_folder(tmp_path, lambda run: None)
    monkeypatch.setattr(_runfolder, "POLL_BYTES", 4096)  # a few records a poll
    steps: list[int] = []
    assert follow(run, lambda r: steps.append(r["step"]), lambda a: None, poll_s=0.01) == "closed"
    assert steps == list(range(20))  # every record, though the run was closed at the first poll
