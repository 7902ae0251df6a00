"""The monitor's side: a per-head signal, a model-level scalar, a per-layer field, an alert on a new
measurement and a live sink, each a built-in: a file under diagnose/monitor/ and its line in _builtins.py
(or, for a sink, its export in diagnose/monitor/__init__.py)."""

from __future__ import annotations

from . import Recipe, insert, new, replace

BUILTINS = "diagnose/monitor/_builtins.py"
MEASUREMENTS = "BUILTIN_MEASUREMENTS = (LOSS, ACTIVATIONS, ATTENTION, ATTENTION_LOGIT, LOGIT_Z, GRAD_NORMS, OPTIMIZER"
DETECTORS = "BUILTIN_DETECTORS = (Nonfinite,"
GUARDS = ("tests/monitor/test_plugins.py", "tests/monitor/test_declared_fields.py")


def builtin(name: str, module: str) -> tuple:
    """The two edits of _builtins.py: its import and its place in BUILTIN_MEASUREMENTS (the last part)."""
    return (insert(BUILTINS, f"from .{module} import {name}", before="BUILTIN_MEASUREMENTS = ("),
            replace(BUILTINS, MEASUREMENTS, f"{MEASUREMENTS}, {name}"))


# A run on the zoo's reference model with lr 0 (the weights, and so every value, stay the model's own),
# attention sampled on steps 0 and 2, a live function sink beside the run folder; then every reader.
RUN = '''
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx

STEPS, EVERY, VOCAB, T = 4, 2, 11, 8


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=T, vocab_size=VOCAB, init_std=0.3))


IDS = torch.randint(1, VOCAB, (4, T), generator=torch.Generator().manual_seed(1))  # [B, T]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run folder, the live sink's scalars by step, the model, the site names, the block names)."""
    model = _model()
    run_dir = tmp_path_factory.mktemp("recipe") / "run"
    seen: dict[int, dict[str, float]] = {}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with TrainingMonitor(model, run_dir, echo=False, attention_every=EVERY,
                         sinks=[lambda scalars, step: seen.setdefault(step, {}).update(scalars)]) as mon:
        for _ in range(STEPS):
            logits = model(IDS)[:, :-1]  # [B, T-1, V]
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), IDS[:, 1:].reshape(-1))
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    return run_dir, seen, model, mon.site_names, mon.block_names


def _stats(run_dir, *more):
    out = CliRunner().invoke(cli, ["stats", str(run_dir), *more])
    assert out.exit_code == 0, out.output
    return out.output


def _tensorboard(run_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _stats(run_dir, "--tensorboard", str(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
'''

# ---- a per-head monitor signal -------------------------------------------------------------------------

HEAD_PROBE = '''
"""sink_weight: per sampled attention site, each head's mean weight on the first key (an attention sink,
Xiao et al. 2023), over the step's forwards and query rows. It reads the attention probe's hooks, as
attention_logit does: no hooks of its own, sampled on the same steps."""

from __future__ import annotations

from typing import Any

import torch

from ..adapters._probs import query_chunks
from ._measure import Measurement, StepInputs, record_field
from ._probes import _Quiet

_CHUNK = 1 << 22  # probability elements per chunk


def first_key_weight(probs: Any) -> torch.Tensor:
    """[H] the mean over examples and query rows of each head's weight on key 0 (no sync)."""
    B, H, Tq, _ = probs.shape
    total = None
    for _, rows in query_chunks(probs, _CHUNK):  # [B, H, c, K]
        part = rows[..., 0].sum((0, 2))  # [H]
        total = part if total is None else total + part
    return total / (B * Tq)


class SinkWeightProbe(_Quiet):
    """On sampled steps: per site, per head, the first-key weight (the mean over the step's forwards)."""

    def __init__(self, monitor: Any):
        self.site_names = monitor.site_names
        monitor.probe("attention").watch.readers.append(self._read)
        self._seen: list[list[torch.Tensor]] = [[] for _ in self.site_names]
        self.ran: list[bool] = []

    def _read(self, i: int, probs: Any) -> None:
        self._seen[i].append(first_key_weight(probs))

    def discard(self) -> None:
        self._seen = [[] for _ in self.site_names]

    def collect(self, inputs: StepInputs) -> list[torch.Tensor | None]:
        out = [torch.stack(s).mean(0)[None] if s else None for s in self._seen]  # per site [1, H]
        self.discard()
        self.ran = [o is not None for o in out]
        return out

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        names = [n for n, r in zip(self.site_names, self.ran) if r]
        for site, unit in zip(names, units):
            record.setdefault("attention", {}).setdefault(site, {})["sink_weight"] = unit["sink_weight"]


SINK_WEIGHT = Measurement("sink_weight", ("sink_weight",), "head", ("attention.*.sink_weight",), SinkWeightProbe,
                          fields=(record_field("sink_weight", "first-key weight", ".4f", per="head", plot=True),))
'''

HEAD_TEST = '"""The built-in per-head `sink_weight` reaches read_run, stats (text, --json, --tensorboard), the report\nand the live sink, equal to the model\'s own attention weights on the first key."""\n' + RUN + '''

def _want(model, sites):
    """Per site, each head's mean weight on key 0, from the model's own softmax output."""
    probs = {}
    hooks = [b.attn.pattern.register_forward_hook(lambda m, a, p, i=i: probs.__setitem__(i, p.detach()))
             for i, b in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            model(IDS)
    finally:
        for h in hooks:
            h.remove()
    return {s: probs[i][..., 0].mean((0, 2)).tolist() for i, s in enumerate(sites)}  # [B, H, Tq, Tk] -> [H]


def test_it_reaches_every_reader(run, tmp_path):
    run_dir, seen, model, sites, _ = run
    want = _want(model, sites)
    table = read_run(run_dir)
    assert "sink_weight" in table.fields("head")
    last = table.attention[table.attention["step"] == 2]
    for site in sites:
        assert list(last[last["site"] == site]["sink_weight"]) == approx(want[site])
    s = json.loads(_stats(run_dir, "--json"))
    assert [v for a in s["attention"] for v in a["sink_weight"]] == approx([v for x in sites for v in want[x]])
    assert "first-key weight" in _stats(run_dir)
    scalars = _tensorboard(run_dir, tmp_path)
    assert [scalars[f"attention/{sites[0]}/sink_weight/head{h}"][-1][1] for h in range(2)] == approx(want[sites[0]])
    _stats(run_dir, "--html", str(tmp_path / "r.html"))
    assert "first-key weight per head over time" in (tmp_path / "r.html").read_text()
    assert [seen[2][f"diagnose/attention/{sites[1]}/sink_weight/head{h}"] for h in range(2)] == approx(want[sites[1]])
'''

HEAD = Recipe(
    "monitor-head", "a per-head monitor signal (a new Measurement per head)", "monitor measurement",
    (new("diagnose/monitor/_probes_sink.py", HEAD_PROBE), *builtin("SINK_WEIGHT", "_probes_sink"),
     new("tests/monitor/test_sink_weight.py", HEAD_TEST),
     insert("docs/monitor.md", "`sink_weight` (per head, on sampled steps): each head's mean weight on the first "
            "key, an attention sink's share.\n", before="## Alerts")),
    "tests/monitor/test_sink_weight.py", guards=GUARDS)

# ---- a model-level scalar and a per-layer field ---------------------------------------------------------

SCALAR_PROBE = '''
"""param_norm: per logged step, the L2 norm of all the model's parameters (weight growth, read at step())."""

from __future__ import annotations

from typing import Any

import torch

from ._measure import Measurement, StepInputs, record_field
from ._probes import _Quiet


class ParamNormProbe(_Quiet):
    """The norm of every parameter together, in float64 sums (no hooks)."""

    def __init__(self, monitor: Any):
        self.model = monitor.model

    def collect(self, inputs: StepInputs) -> torch.Tensor:
        total = sum(p.detach().double().square().sum() for p in self.model.parameters())
        return torch.stack([total.sqrt()])[:, None]  # [1 unit, 1 row]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        record["param_norm"] = units[0]["norm"][0]


PARAM_NORM = Measurement("param_norm", ("norm",), "model", ("param_norm",), ParamNormProbe,
                         fields=(record_field("param_norm", "parameter norm", ".6g"),))
'''

SCALAR_TEST = '"""The built-in model-level `param_norm` reaches read_run, stats (text, --json, --tensorboard), the\nreport and the live sink, equal to the norm of the model\'s parameters."""\n' + RUN + '''

def test_it_reaches_every_reader(run, tmp_path):
    run_dir, seen, model, _, _ = run
    want = float(sum(p.detach().double().square().sum() for p in model.parameters()).sqrt())
    table = read_run(run_dir)
    assert "param_norm" in table.fields("model") and list(table.steps["param_norm"]) == approx([want] * STEPS)
    assert json.loads(_stats(run_dir, "--json"))["last"]["param_norm"] == approx(want)
    text = _stats(run_dir)
    assert "parameter norm" in text and format(want, ".6g") in text
    assert [v for _, v in _tensorboard(run_dir, tmp_path)["param_norm"]] == approx([want] * STEPS)
    _stats(run_dir, "--html", str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert "parameter norm" in html and format(want, ".6g") in html
    assert [seen[s]["diagnose/param_norm"] for s in range(STEPS)] == approx([want] * STEPS)
'''

SCALAR = Recipe(
    "monitor-scalar", "a model-level monitor scalar", "monitor measurement",
    (new("diagnose/monitor/_probes_norm.py", SCALAR_PROBE), *builtin("PARAM_NORM", "_probes_norm"),
     new("tests/monitor/test_param_norm.py", SCALAR_TEST),
     insert("docs/monitor.md", "`param_norm` (per logged step): the L2 norm of all the model's parameters.\n",
            before="## Alerts")),
    "tests/monitor/test_param_norm.py", guards=GUARDS)

LAYER_PROBE = '''
"""block_norm: per logged step, each block's parameters' L2 norm (which block's weights grow)."""

from __future__ import annotations

from typing import Any

import torch

from ._measure import Measurement, StepInputs, record_field
from ._probes import _Quiet


class BlockNormProbe(_Quiet):
    """Each block's parameter norm, in float64 sums (no hooks)."""

    def __init__(self, monitor: Any):
        self.blocks = [b for _, b in monitor.blocks]
        self.names = monitor.block_names

    def collect(self, inputs: StepInputs) -> torch.Tensor:
        return torch.stack([sum(p.detach().double().square().sum() for p in b.parameters()).sqrt()
                            for b in self.blocks])[:, None]  # [L units, 1 row]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        for name, unit in zip(self.names, units):
            record["layers"][name]["block_norm"] = unit["norm"][0]


BLOCK_NORM = Measurement("block_norm", ("norm",), "layer", ("layers.*.block_norm",), BlockNormProbe,
                         fields=(record_field("block_norm", "block weight norm", ".5g", per="layer", plot=True),))
'''

LAYER_TEST = '"""The built-in per-layer `block_norm` reaches read_run, stats (text, --json, --tensorboard), the report\nand the live sink, equal to each block\'s parameter norm."""\n' + RUN + '''

def test_it_reaches_every_reader(run, tmp_path):
    run_dir, seen, model, _, blocks = run
    want = [float(sum(p.detach().double().square().sum() for p in b.parameters()).sqrt()) for b in model.blocks]
    table = read_run(run_dir)
    assert "block_norm" in table.fields("layer")
    assert [table.steps[f"layers/{b}/block_norm"].iloc[-1] for b in blocks] == approx(want)
    assert [row["block_norm"] for row in json.loads(_stats(run_dir, "--json"))["layers"]] == approx(want)
    text = _stats(run_dir)
    assert "block weight norm" in text and format(want[1], ".5g") in text
    assert _tensorboard(run_dir, tmp_path)[f"layers/{blocks[1]}/block_norm"][-1][1] == approx(want[1])
    _stats(run_dir, "--html", str(tmp_path / "r.html"))
    assert "block weight norm through depth over time" in (tmp_path / "r.html").read_text()
    assert seen[3][f"diagnose/layers/{blocks[0]}/block_norm"] == approx(want[0])
'''

LAYER = Recipe(
    "monitor-layer", "a per-layer monitor field", "monitor measurement",
    (new("diagnose/monitor/_probes_blocks.py", LAYER_PROBE), *builtin("BLOCK_NORM", "_probes_blocks"),
     new("tests/monitor/test_block_norm.py", LAYER_TEST),
     insert("docs/monitor.md", "`layers/<block>/block_norm` (per logged step): each block's parameter norm.\n",
            before="## Alerts")),
    "tests/monitor/test_block_norm.py", guards=GUARDS)

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
                             reduce={"max": "max"}, fields=(record_field("max_abs_weight", "largest |weight|", ".4g"),))
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
largest |w|; the alert fires with its own threshold and hint, reaches read_run, `stats --json` and a live
sink, and stays quiet at its default."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import Thresholds, TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx


def _train(run_dir, **kw):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    with TrainingMonitor(model, run_dir, echo=False, sinks=[lambda s, step: seen.append(s)], **kw) as mon:
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


def test_it_is_quiet_at_its_default(tmp_path):
    _train(tmp_path / "quiet")
    assert [a for a in read_run(tmp_path / "quiet").alerts if a["kind"] == "huge_weight"] == []
'''

ALERT = Recipe(
    "monitor-alert", "a new monitor alert on a new measurement", "alert detector",
    (new("diagnose/monitor/_probes_maxweight.py", ALERT_PROBE), *builtin("MAX_ABS_WEIGHT", "_probes_maxweight"),
     new("diagnose/monitor/_detect_weights.py", ALERT_DETECTOR),
     insert(BUILTINS, "from ._detect_weights import HugeWeight", before="BUILTIN_MEASUREMENTS = ("),
     replace(BUILTINS, DETECTORS, f"{DETECTORS} HugeWeight,"),
     new("tests/monitor/test_huge_weight.py", ALERT_TEST),
     insert("docs/monitor.md", "| `huge_weight` | a parameter's largest \\|w\\| > `max_abs_weight` (default 1e4; "
            "measured as `max_abs_weight`) | lower the lr, weight decay, init scale |", after="| `nonfinite` (error)")),
    "tests/monitor/test_huge_weight.py", guards=GUARDS,
    note="7 with a figure of its own in the report (`reports/_view_training.py`, `reports/_plots_training.py`).")

# ---- a live sink -----------------------------------------------------------------------------------------

SINK = '''
"""JSONLinesSink: every logged step's scalars (and alerts, evaluations) as one strict-JSON line each, for
tools that tail a file; the same scalars the trackers get."""

from __future__ import annotations

import os
from typing import Any

from .. import _json
from ._live import LiveSink


class JSONLinesSink(LiveSink):
    """Appends `{"step": s, "scalars": {...}}` lines to `path`, flushed as written (a NaN is null)."""

    def __init__(self, path: str | os.PathLike):
        self._file = open(path, "a", encoding="utf-8")

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

import torch
import torch.nn.functional as F

from diagnose.monitor import JSONLinesSink, TrainingMonitor
from diagnose.zoo import ModelConfig, Transformer


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
    "sink", "a live sink (a tracker of its own)", "output sink",
    (new("diagnose/monitor/_live_jsonl.py", SINK),
     insert("diagnose/monitor/__init__.py", "from ._live_jsonl import JSONLinesSink", after="from ._live import"),
     replace("diagnose/monitor/__init__.py", '"CallableSink", ', '"CallableSink", "JSONLinesSink", '),
     new("tests/monitor/test_jsonl_sink.py", SINK_TEST),
     insert("docs/monitor.md", "| `JSONLinesSink(path)` | one strict-JSON line per step, alert and evaluation | — |",
            after="| a function `f(scalars, step)` | your code |")),
    "tests/monitor/test_jsonl_sink.py", guards=("tests/monitor/test_live_sinks.py",),
    note="5 with a tracker's library to install (its extra in `pyproject.toml`).")

RECIPES = [HEAD, SCALAR, LAYER, ALERT, SINK_RECIPE]
