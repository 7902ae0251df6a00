"""A training process killed with SIGKILL leaves a log that read_run and `diagnose stats` read
in full up to the last flushed step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import read_run

pytestmark = pytest.mark.numerics

TRAIN = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from diagnose.monitor import TrainingMonitor
    from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, train
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=32))
    mon = TrainingMonitor(model, sys.argv[1], attention_every=3, every=1, echo=False)

    def on_backward(step, loss, opt):
        mon.step(loss, optimizer=opt, step=step)
        print(step, flush=True)  # this step's record is already flushed

    train(model, induction(n=256, length=16), TrainConfig(steps=100000, batch_size=8), on_backward=on_backward)
""")


@pytest.mark.slow
def test_sigkill_mid_run_leaves_a_readable_log(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env)
    last = -1
    guard = threading.Timer(120, proc.kill)  # a stuck child ends the read below instead of hanging the suite
    guard.start()
    try:
        while last < 25:
            line = proc.stdout.readline()
            if not line:
                break
            last = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
    assert last >= 25, "the training subprocess did not get going"
    run = read_run(run_dir)
    steps = run.steps["step"].tolist()
    assert steps[: last + 1] == list(range(last + 1))  # every step it reported is there
    assert not run.closed and run.skipped_lines <= 1
    result = CliRunner().invoke(cli, ["stats", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["last_step"] == steps[-1] >= last and summary["closed"] is False
