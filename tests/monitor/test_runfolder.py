"""The run folder survives torn writes and says clearly when it is not a run."""

from __future__ import annotations

import json
import math

import pytest

from diagnose.errors import RunFolderError
from diagnose.monitor._runfolder import SCHEMA, RunTail, RunWriter, read_run


def _rec(step, loss=1.0):
    return {"step": step, "time": 0.0, "loss": loss, "lr": 0.1, "grad_norm": 2.0,
            "layers": {"blocks.0": {"grad_norm": 1.0, "act_mean": 0.0, "act_var": 1.0, "act_max_abs": 3.0,
                                    "token_cos": 0.1}},
            **({"attention": {"blocks.0.attn": {"entropy": [1.0, 2.0], "max_weight": [0.5, 0.25]}}} if step % 2 == 0 else {})}


def test_roundtrip_flat_columns_tidy_attention_and_nan(tmp_path):
    w = RunWriter(tmp_path, {"model": {"blocks": ["blocks.0"]}, "settings": {}})
    for s in range(3):
        w.write_step(_rec(s, loss=float("nan") if s == 2 else 1.0))
    w.write_alert({"step": 2, "kind": "nonfinite", "severity": "error", "where": "loss", "message": "m", "hint": "h"})
    w.close()
    run = read_run(tmp_path)
    assert run.info["schema"] == SCHEMA and run.closed
    assert run.steps["step"].tolist() == [0, 1, 2]
    assert run.steps["layers/blocks.0/act_max_abs"].tolist() == [3.0] * 3
    ent = run.steps["attention/blocks.0.attn/entropy_mean"]
    assert ent[0] == 1.5 and math.isnan(ent[1])  # not sampled at step 1
    assert math.isnan(run.steps["loss"][2])
    assert run.attention[["step", "head", "max_weight"]].values.tolist() == [[0, 0, 0.5], [0, 1, 0.25], [2, 0, 0.5], [2, 1, 0.25]]
    assert run.alerts[0]["kind"] == "nonfinite" and run.layers == ["blocks.0"]


def test_torn_last_line_is_skipped_and_restart_starts_a_fresh_line(tmp_path):
    w = RunWriter(tmp_path, {"settings": {}})
    w.write_step(_rec(0))
    w.write_step(_rec(1))
    w._metrics.write(json.dumps(_rec(2))[:25])  # a writer killed mid-line
    w._metrics.flush()
    run = read_run(tmp_path)
    assert run.steps["step"].tolist() == [0, 1] and run.skipped_lines == 1 and not run.closed
    with pytest.warns(UserWarning, match="appending as session 1"):
        w2 = RunWriter(tmp_path, {"settings": {}})
    w2.write_step(_rec(3))
    w2.close()
    run = read_run(tmp_path)
    assert run.steps["step"].tolist() == [0, 1, 3] and run.skipped_lines == 1


def test_tail_returns_only_complete_new_lines(tmp_path):
    w = RunWriter(tmp_path, {"settings": {}})
    tail = RunTail(tmp_path)
    w.write_step(_rec(0))
    w._metrics.write('{"step": 1, "lo')
    w._metrics.flush()
    steps, alerts, closed = tail.poll()
    assert [r["step"] for r in steps] == [0] and not closed
    w._metrics.write('ss": 2.0}\n')
    w.close()
    steps, alerts, closed = tail.poll()
    assert [r["step"] for r in steps] == [1] and closed


@pytest.mark.parametrize("make, match", [
    (lambda p: None, "no run.json"),
    (lambda p: (p / "run.json").write_text("[1, 2"), "not valid JSON"),
    (lambda p: (p / "run.json").write_text('{"schema": "other/1"}'), "not a diagnose.run/1"),
    (lambda p: RunWriter(p, {"settings": {}}).close(), "holds no logged steps"),
])
def test_bad_folders_raise_one_line(tmp_path, make, match):
    make(tmp_path)
    with pytest.raises(RunFolderError, match=match) as err:
        read_run(tmp_path)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_missing_folder(tmp_path):
    with pytest.raises(RunFolderError, match="is not a folder"):
        read_run(tmp_path / "nope")
