"""Progress a person can wait by (issue 32): plain lines every few seconds when stderr is not a terminal,
with the forward passes and, once the first batch is done, the time left; a fake clock, never the real one."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.ablation import ProgressEvent, ProgressLog, ablate_heads
from diagnose.ablation.progress import describe, duration, time_left
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


class FakeClock:
    """Seconds that move only when the test says: `step` per reading."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_log_lines_every_few_seconds_with_the_time_left_after_the_first_batch():
    lines: list[str] = []
    log = ProgressLog(lines.append, "ablating heads", FakeClock(2.0), every=5.0)
    log(ProgressEvent(0, 40, note="micro-batch 32 of 32", forwards=0, first=10))
    for done in range(1, 41):
        log(ProgressEvent(done, 40, forwards=2 * done, first=10))
    log.finish()
    assert len(lines) == 14  # readings 2 s apart: a line every third step (6 s), and the last
    assert lines[0] == "ablating heads: micro-batch 32 of 32; 3/40 steps (8%), 6 forward passes, 6s elapsed"
    assert "left" not in lines[2] and lines[3].endswith("12/40 steps (30%), 24 forward passes, 24s elapsed, "
                                                         "about 56s left")
    assert lines[-1] == "ablating heads: 40/40 steps (100%), 80 forward passes, 1m22s elapsed"


def test_nothing_is_written_before_a_step_nor_twice_at_the_end():
    lines: list[str] = []
    log = ProgressLog(lines.append, "x", FakeClock(100.0))
    log(ProgressEvent(0, 4, note="plan"))
    assert lines == []  # a sweep that fails now leaves only its error
    log(ProgressEvent(4, 4))
    log.finish()
    assert lines == ["x: plan; 4/4 steps (100%), 1m40s elapsed"]


def test_a_sweep_done_within_the_cadence_writes_no_line_at_all():
    """The totals only close a log that was started: a quick run stays silent (an error after it, one line)."""
    lines: list[str] = []
    log = ProgressLog(lines.append, "x", FakeClock(1.0), every=5.0)
    log(ProgressEvent(0, 3, note="plan"))
    for done in range(1, 4):
        log(ProgressEvent(done, 3))
    log.finish()
    assert lines == []


def test_words():
    assert [duration(s) for s in (4.4, 130, 3900)] == ["4s", "2m10s", "1h05m"]
    assert time_left(ProgressEvent(5, 20, first=10), 50.0) is None  # the first batch is not done yet
    assert time_left(ProgressEvent(10, 20, first=10), 50.0) == 50.0
    assert describe(ProgressEvent(1, 2), 3.0) == "1/2 steps (50%), 3s elapsed"


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=2, n_heads=2, d_model=16,
                                   init_std=0.3)).eval()


def test_the_engine_counts_a_step_per_head_and_the_passes(lm):
    events: list[ProgressEvent] = []
    ids = torch.randint(1, 12, (6, 6), generator=torch.Generator().manual_seed(0))
    result = ablate_heads(lm, {"input_ids": ids}, task="lm", batch_size=3, progress=events.append, attention=False)
    steps = [e for e in events if e.note is None and e.stage is None]  # the sweep's own
    assert steps[-1].done == steps[-1].total == 2 * 4  # 2 batches x 4 heads
    assert steps[-1].first == 4 and steps[-1].forwards <= result.timing["forward_passes"]
    assert [e.done for e in steps] == sorted(e.done for e in steps)
    direct = [e for e in events if e.stage == "direct effects"]
    chunks = 2 * -(-2 // result.timing["replication"])  # per batch: each layer's 2 heads in chunks
    assert direct[0].done == 0 and direct[-1].done == direct[-1].total == 2 * chunks  # 2 batches
    assert direct[-1].forwards > steps[-1].forwards  # the direct passes count among the forwards
    stages = list(dict.fromkeys(e.stage for e in events))
    assert stages == [None, "direct effects", "look-alike heads closed together", "analyses"]


def test_each_stage_after_the_sweep_closes_the_one_before_and_says_its_name():
    """A long stage after the sweep (direct effects) is never silent, and its time left is its own."""
    lines: list[str] = []
    log = ProgressLog(lines.append, "ablating heads", FakeClock(10.0), every=5.0)
    log(ProgressEvent(0, 2, first=1))
    log(ProgressEvent(1, 2, first=1))  # 20 s: a line
    log(ProgressEvent(2, 2, first=1))
    log(ProgressEvent(0, 4, forwards=9, first=1, stage="direct effects"))  # closes the sweep, then its own
    log(ProgressEvent(1, 4, forwards=10, first=1, stage="direct effects"))
    log(ProgressEvent(0, 0, stage="analyses"))
    log.finish()
    assert lines == ["ablating heads: 1/2 steps (50%), 10s elapsed, about 10s left",
                     "ablating heads: 2/2 steps (100%), 20s elapsed",
                     "ablating heads: direct effects: 0/4 steps (0%), 9 forward passes, 30s elapsed",
                     "ablating heads: direct effects: 1/4 steps (25%), 10 forward passes, 40s elapsed, "
                     "about 30s left",
                     "ablating heads: analyses: 50s elapsed"]


def test_cli_logs_progress_when_stderr_is_not_a_terminal(lm, tmp_path, monkeypatch):
    from diagnose.cli import _progress
    from diagnose.cli.main import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_progress, "CLOCK", FakeClock(10.0))  # every reading 10 s on: a line per step
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 12, (6, 6), generator=torch.Generator().manual_seed(1))},
               tmp_path / "d.pt")
    run = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "d.pt", "--json", "h.json", "--batch-size", "3",
                                   "--no-direct"])
    assert run.exit_code == 0, run.output
    lines = [x for x in run.stderr.splitlines() if x.startswith("ablating heads: ")]
    timing = json.loads((tmp_path / "h.json").read_text())["timing"]
    assert lines[0].startswith(f"ablating heads: micro-batch {timing['micro_batch']} of 3")
    assert any("left" in x for x in lines[1:-1])  # after the first batch, an estimate
    done = [x for x in lines if x.startswith("ablating heads: 8/8 steps (100%)")]
    assert len(done) == 1 and "forward passes" in done[0]  # the sweep's last line, then each later stage's
    assert lines[-1] == lines[-1].split(": ")[0] + ": analyses: " + lines[-1].split("analyses: ")[1]
