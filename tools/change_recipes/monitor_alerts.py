"""The monitor's side, continued: an alert kind on a new measurement (a measurement file, a detector file,
their lines in _builtins.py) and a live sink (a file and its export in diagnose/monitor/__init__.py)."""

from __future__ import annotations

from . import Recipe, insert, new, replace
from .monitor import BUILTINS, DETECTORS, GUARDS, builtin

# ---- an alert on a new measurement ----------------------------------------------------------------------

ALERT_PROBE = '''
"""max_abs_weight: per logged step, the largest |w| of any parameter (a weight running away)."""

from __future__ import annotations

from typing import Any

import torch

from ._measure import Measurement, StepInputs, record_field
from ._probes import _Quiet


class MaxWeightProbe(_Quiet):
    def __init__(self, monitor: Any):
        self.model = monitor.model

    def collect(self, inputs: StepInputs) -> torch.Tensor:
        return torch.stack([p.detach().abs().amax().float() for p in self.model.parameters()]).amax()[None, None]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        record["max_abs_weight"] = units[0]["max"][0]


MAX_ABS_WEIGHT = Measurement("max_abs_weight", ("max",), "model", ("max_abs_weight",), MaxWeightProbe,
                             reduce={"max": "max"}, fields=(record_field("max_abs_weight", "largest |weight|", ".4g", plot=True),))
'''

ALERT_DETECTOR = '''
"""huge_weight: a parameter's largest |w| past `max_abs_weight` (its measurement: _probes_maxweight.py)."""

from __future__ import annotations

from ._detect import Detector


class HugeWeight(Detector):
    kind, severity, hint = "huge_weight", "warning", "lower the lr, add weight decay, check the init scale"
    defaults = {"max_abs_weight": 1e4}

    def check(self, rec, ctx, emit):
        value = rec.get("max_abs_weight")
        big = value is not None and value > ctx.threshold("max_abs_weight")
        emit(big, "", f"largest |weight| {value:.4g}" if big else "")
'''

ALERT_TEST = '''
"""The built-in `huge_weight` alert on the built-in `max_abs_weight` measurement: the value is the model's
largest |w|; the alert fires with its own threshold and hint, reaches read_run, `stats --json`, a live
sink and the report (a curve of its own, the field being declared with plot=True), and stays quiet at its
default."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import Thresholds, TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx

pytestmark = pytest.mark.numerics  # trains, floats compared: every kernel path


def _train(run_dir, **kw):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    with TrainingMonitor(model, run_dir, echo=False, every=1, sinks=[lambda s, step: seen.append(s)], **kw) as mon:
        for _ in range(3):
            loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.zero_grad()
    return model, seen


def test_it_fires_with_its_threshold_and_hint_and_reaches_the_readers(tmp_path):
    model, seen = _train(tmp_path / "run", thresholds=Thresholds(extra={"max_abs_weight": 0.0}))
    run = read_run(tmp_path / "run")
    want = max(float(p.detach().abs().max()) for p in model.parameters())
    assert list(run.steps["max_abs_weight"]) == approx([want] * 3)
    alerts = [a for a in run.alerts if a["kind"] == "huge_weight"]
    assert [(a["step"], a["hint"]) for a in alerts] == [(0, "lower the lr, add weight decay, check the init scale")]
    out = CliRunner().invoke(cli, ["stats", str(tmp_path / "run"), "--json"])
    assert out.exit_code == 0, out.output
    assert [a["kind"] for a in json.loads(out.output)["alerts"]].count("huge_weight") == 1
    assert any("diagnose/alerts/huge_weight" in s for s in seen)
    out = CliRunner().invoke(cli, ["stats", str(tmp_path / "run"), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    html = (tmp_path / "r.html").read_text()
    assert "largest |weight| over time" in html and "huge_weight" in html


def test_it_is_quiet_at_its_default(tmp_path):
    _train(tmp_path / "quiet")
    assert [a for a in read_run(tmp_path / "quiet").alerts if a["kind"] == "huge_weight"] == []
'''

ALERT = Recipe(
    "monitor-alert", "a new monitor alert on a new measurement", ("alert detector", "monitor measurement"),
    (new("diagnose/monitor/_probes_maxweight.py", ALERT_PROBE), *builtin("MAX_ABS_WEIGHT", "_probes_maxweight"),
     new("diagnose/monitor/_detect_weights.py", ALERT_DETECTOR),
     insert(BUILTINS, "from ._detect_weights import HugeWeight", before="BUILTIN_MEASUREMENTS = ("),
     replace(BUILTINS, DETECTORS, f"{DETECTORS} HugeWeight,"),
     new("tests/monitor/test_huge_weight.py", ALERT_TEST),
     insert("docs/monitor.md", "| `huge_weight` | a parameter's largest \\|w\\| > `max_abs_weight` (default 1e4; "
            "measured as `max_abs_weight`) | lower the lr, weight decay, init scale |", after="| `nonfinite` (error)")),
    "tests/monitor/test_huge_weight.py", guards=GUARDS,
    note="its figure in the report (a curve over the steps, with the alerts marked) comes from `plot=True` on "
         "its field: no file more.")

# ---- a live sink -----------------------------------------------------------------------------------------

SINK = '''
"""JSONLinesSink: every logged step's scalars (and alerts, evaluations) as one strict-JSON line each, for
tools that tail a file; the same scalars the trackers get."""

from __future__ import annotations

import os
from pathlib import Path

from .. import _json
from ._live import LiveSink
from ._runfolder import _open_append


class JSONLinesSink(LiveSink):
    """Appends `{"step": s, "scalars": {...}}` lines to `path`, flushed as written (a NaN is null), through
    the run folder's appender (a torn last line left by a killed run is ended first)."""

    def __init__(self, path: str | os.PathLike):
        self._file = _open_append(Path(path))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._file.write(_json.dumps({"step": step, "scalars": scalars}) + "\\n")
        self._file.flush()

    def close(self, steps_seen: int) -> None:
        self._file.close()
'''

SINK_TEST = '''
"""The built-in JSONLinesSink receives what a live sink gets: the step's scalars, alerts, evaluations."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from diagnose.monitor import JSONLinesSink, TrainingMonitor
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics  # trains: every kernel path


def test_it_writes_the_scalars_a_live_sink_gets(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with TrainingMonitor(model, None, echo=False, sinks=[JSONLinesSink(tmp_path / "live.jsonl"),
                                                         lambda s, step: seen.append({"step": step, "scalars": s})]) as mon:
        for s in range(3):
            loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
        mon.log_eval(2, loss=1.0)
    lines = [json.loads(line) for line in (tmp_path / "live.jsonl").read_text().splitlines()]
    assert lines == seen and "diagnose/loss" in lines[0]["scalars"] and "diagnose/eval/loss" in lines[-1]["scalars"]
'''

SINK_RECIPE = Recipe(
    "sink", "a live sink (a tracker of its own)", ("output sink",),
    (new("diagnose/monitor/_live_jsonl.py", SINK),
     insert("diagnose/monitor/__init__.py", "from ._live_jsonl import JSONLinesSink", after="from ._live import"),
     replace("diagnose/monitor/__init__.py", '"CallableSink", ', '"CallableSink", "JSONLinesSink", '),
     new("tests/monitor/test_jsonl_sink.py", SINK_TEST),
     insert("docs/monitor.md", "| `JSONLinesSink(path)` | one strict-JSON line per step, alert and evaluation | — |",
            after="| a function `f(scalars, step)` | your code |")),
    "tests/monitor/test_jsonl_sink.py", guards=("tests/monitor/test_live_sinks.py",),
    note="5 with a tracker's library to install (its extra in `pyproject.toml`).")

RECIPES = [ALERT, SINK_RECIPE]
