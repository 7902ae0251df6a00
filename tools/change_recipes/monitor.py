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

pytestmark = pytest.mark.numerics  # trains, floats compared: every kernel path

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
    with TrainingMonitor(model, run_dir, echo=False, every=1, attention_every=EVERY,
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

from ..adapters import query_chunks
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
    "monitor-head", "a per-head monitor signal (a new Measurement per head)", ("monitor measurement",),
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
    "monitor-scalar", "a model-level monitor scalar", ("monitor measurement",),
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
    "monitor-layer", "a per-layer monitor field", ("monitor measurement",),
    (new("diagnose/monitor/_probes_blocks.py", LAYER_PROBE), *builtin("BLOCK_NORM", "_probes_blocks"),
     new("tests/monitor/test_block_norm.py", LAYER_TEST),
     insert("docs/monitor.md", "`layers/<block>/block_norm` (per logged step): each block's parameter norm.\n",
            before="## Alerts")),
    "tests/monitor/test_block_norm.py", guards=GUARDS)

RECIPES = [HEAD, SCALAR, LAYER]
