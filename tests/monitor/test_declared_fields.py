"""The read side walks the declared record fields: a toy per-head signal, a toy model-level scalar
and a toy per-layer field, each registered from outside the package with its Field, reach
read_run's tables, `diagnose stats` (its tables, --json and --tensorboard), the report and a live
sink; so does the shipped per-head `attention.<site>.max_logit`; and a folder whose fields nothing
declares any more (an older run, another process) still shows them, by name."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import (Measurement, TrainingMonitor, read_run, record_field, register_measurement,
                              unregister_measurement)
from ..tolerance import approx

pytestmark = pytest.mark.numerics

STEPS, EVERY = 4, 2  # attention (and the toy per-head signal) sampled on steps 0 and 2
VOCAB, T = 11, 8
HEAD = record_field("toy_q_norm", "toy query norm", ".5g", "w", per="head", plot=True)
SCALAR = record_field("toy_sq_sum", "toy squared weights", ".6g", plot=True)
LAYER = record_field("toy_block_norm", "toy block norm", ".5g", per="layer", plot=True)


def _q_norms(attn: torch.nn.Module, n_heads: int) -> torch.Tensor:
    """[H] each head's query weights' norm: GPT-2's c_attn is a Conv1D, weight [d, 3d], queries first."""
    w = attn.c_attn.weight.detach()
    d = w.shape[0]
    return w[:, :d].reshape(d, n_heads, d // n_heads).norm(dim=(0, 2))


class _NoHooks:
    def __init__(self, monitor):
        self.monitor, self.sampled = monitor, False

    def arm(self, step, logged, sampled):
        self.sampled = sampled

    def discard(self):
        pass

    def remove(self):
        pass


class _QueryNorms(_NoHooks):
    """Per head of each attention site, on sampled steps: its query weights' norm."""

    def collect(self, inputs):
        if not self.sampled:
            return None
        return [_q_norms(s.module, s.n_heads)[None, :] for s in self.monitor.sites]  # per site [1, H]

    def write(self, record, units):
        for site, unit in zip(self.monitor.site_names, units):
            record.setdefault("attention", {}).setdefault(site, {})["toy_q_norm"] = unit["q"]


class _SquaredWeights(_NoHooks):
    """The model's sum of squared parameters: one number per logged step."""

    def collect(self, inputs):
        return torch.stack([sum(p.detach().double().square().sum() for p in self.monitor.model.parameters())])[:, None]

    def write(self, record, units):
        record["toy_sq_sum"] = units[0]["total"][0]


class _BlockNorms(_NoHooks):
    """Each block's parameters' norm."""

    def collect(self, inputs):
        return torch.stack([torch.cat([p.detach().flatten() for p in b.parameters()]).norm()
                            for _, b in self.monitor.blocks])[:, None]  # [L, 1]

    def write(self, record, units):
        for name, unit in zip(self.monitor.block_names, units):
            record["layers"][name]["toy_block_norm"] = unit["norm"][0]


TOYS = (Measurement("toy_head", ("q",), "head", ("attention.*.toy_q_norm",), _QueryNorms, fields=(HEAD,)),
        Measurement("toy_scalar", ("total",), "model", ("toy_sq_sum",), _SquaredWeights, fields=(SCALAR,)),
        Measurement("toy_layer", ("norm",), "layer", ("layers.*.toy_block_norm",), _BlockNorms, fields=(LAYER,)))


def _gpt2():
    """A tiny Hugging Face GPT-2 with eager attention: its softmax's input gives max_logit."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=T, vocab_size=VOCAB,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """(run folder, the live sink's scalars by step, the model) of a run with the toys registered;
    lr 0: the weights, and so the toys' values, stay as the model's own."""
    for m in TOYS:
        register_measurement(m)
    try:
        model = _gpt2()
        run_dir = tmp_path_factory.mktemp("declared") / "run"
        seen: dict[int, dict[str, float]] = {}
        ids = torch.randint(1, VOCAB, (4, T), generator=torch.Generator().manual_seed(1))  # [B, T]
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with TrainingMonitor(model, run_dir, every=1, echo=False, attention_every=EVERY,
                             sinks=[lambda scalars, step: seen.setdefault(step, {}).update(scalars)]) as mon:
            for _ in range(STEPS):
                logits = model(input_ids=ids, use_cache=False).logits[:, :-1]  # [B, T-1, V]
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
                loss.backward()
                mon.step(loss, optimizer=opt)
                opt.step()
                opt.zero_grad()
        yield run_dir, seen, model, mon.site_names, mon.block_names
    finally:
        for m in TOYS:
            unregister_measurement(m.name)


def _want(model, sites, blocks):
    """The toys' values computed here from the model: per site the heads' query norms, the sum of
    squares, per block the norm."""
    heads = {s: [float(_q_norms(model.transformer.h[i].attn, 2)[h]) for h in range(2)] for i, s in enumerate(sites)}
    total = float(sum(p.detach().double().square().sum() for p in model.parameters()))
    norms = {b: float(torch.cat([p.detach().flatten() for p in model.transformer.h[i].parameters()]).norm())
             for i, b in enumerate(blocks)}
    return heads, total, norms


def test_toy_fields_and_max_logit_reach_read_runs_tables(toy_run):
    run_dir, _, model, sites, blocks = toy_run
    heads, total, norms = _want(model, sites, blocks)
    run = read_run(run_dir)
    assert {"toy_q_norm", "max_logit", "entropy"} <= set(run.fields("head"))
    assert "toy_sq_sum" in run.fields("model") and "toy_block_norm" in run.fields("layer")
    last = run.attention[run.attention["step"] == 2]
    for site in sites:
        assert list(last[last["site"] == site]["toy_q_norm"]) == approx(heads[site])
        assert list(last[last["site"] == site]["max_logit"]) == run.records[2]["attention"][site]["max_logit"]
        assert run.steps[f"attention/{site}/max_logit_mean"].iloc[2] == approx(
            sum(run.records[2]["attention"][site]["max_logit"]) / 2)
    assert sorted(set(run.attention["step"])) == [0, 2]  # only the sampled steps: the toy follows them
    assert all(math.isfinite(v) for v in run.attention["max_logit"])
    assert list(run.steps["toy_sq_sum"]) == approx([total] * STEPS)
    assert [run.steps[f"layers/{b}/toy_block_norm"].iloc[-1] for b in blocks] == approx([norms[b] for b in blocks])


def test_toy_fields_reach_stats_and_its_json(toy_run):
    run_dir, _, model, sites, blocks = toy_run
    heads, total, norms = _want(model, sites, blocks)
    out = CliRunner().invoke(cli, ["stats", str(run_dir), "--json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    assert s["last"]["toy_sq_sum"] == approx(total)
    assert [row["toy_block_norm"] for row in s["layers"]] == approx([norms[b] for b in blocks])
    assert [v for a in s["attention"] for v in a["toy_q_norm"]] == approx([v for x in sites for v in heads[x]])
    assert all(len(a["max_logit"]) == 2 for a in s["attention"])
    text = CliRunner().invoke(cli, ["stats", str(run_dir)], env={"COLUMNS": "240"})  # xdist sets COLUMNS=80
    assert text.exit_code == 0, text.output
    for header in ("toy query norm [w]", "toy squared weights", "toy block norm", "max logit"):
        assert header in text.output
    assert format(total, ".6g") in text.output  # in the field's declared format
    assert " ".join(format(v, ".5g") for v in heads[sites[0]]) in text.output
    step = json.loads(CliRunner().invoke(cli, ["stats", str(run_dir), "--step", "3", "--json"]).output)
    assert step["record"]["toy_sq_sum"] == approx(total)


def test_toy_fields_and_max_logit_reach_tensorboard(toy_run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, model, sites, blocks = toy_run
    heads, total, norms = _want(model, sites, blocks)
    out = CliRunner().invoke(cli, ["stats", str(run_dir), "--tensorboard", str(tmp_path / "tb")])
    assert out.exit_code == 0, out.output
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert [v for _, v in scalars["toy_sq_sum"]] == approx([total] * STEPS)
    assert scalars[f"layers/{blocks[1]}/toy_block_norm"][-1][1] == approx(norms[blocks[1]])
    records = read_run(run_dir).records
    for site in sites:
        for key, want in (("toy_q_norm", heads[site]), ("max_logit", records[2]["attention"][site]["max_logit"])):
            got = [scalars[f"attention/{site}/{key}/head{h}"] for h in range(2)]
            assert [[s for s, _ in g] for g in got] == [[0, 2]] * 2  # the sampled steps
            assert [g[-1][1] for g in got] == approx(want)


def test_toy_fields_reach_the_report_and_the_live_sink(toy_run, tmp_path):
    run_dir, seen, model, sites, blocks = toy_run
    heads, total, norms = _want(model, sites, blocks)
    out = CliRunner().invoke(cli, ["stats", str(run_dir), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    html = (tmp_path / "r.html").read_text()
    for text in ("toy query norm [w]", "toy squared weights", "toy block norm", format(total, ".6g"),
                 format(norms[blocks[0]], ".5g"), format(heads[sites[1]][1], ".5g"),
                 "toy query norm [w] per head over time", "max logit per head over time",
                 "toy block norm through depth over time", "toy squared weights over time"):
        assert text in html
    assert sorted(seen) == list(range(STEPS))
    assert [seen[s]["diagnose/toy_sq_sum"] for s in range(STEPS)] == approx([total] * STEPS)
    assert seen[3][f"diagnose/layers/{blocks[0]}/toy_block_norm"] == approx(norms[blocks[0]])
    for site in sites:
        assert [seen[2][f"diagnose/attention/{site}/toy_q_norm/head{h}"] for h in range(2)] == approx(heads[site])
        assert f"diagnose/attention/{site}/max_logit/head1" in seen[2]
        assert not any(k.startswith(f"diagnose/attention/{site}/") for k in seen[3])  # step 3 was not sampled


def test_fields_nothing_declares_are_shown_by_name(toy_run):
    """The same folder read with the toys unregistered (an older run, another process): every
    toy value is still in the tables, the JSON and the text, under its key."""
    run_dir, _, model, sites, blocks = toy_run
    heads, total, _ = _want(model, sites, blocks)
    for m in TOYS:
        unregister_measurement(m.name)
    try:
        s = json.loads(CliRunner().invoke(cli, ["stats", str(run_dir), "--json"]).output)
        assert s["last"]["toy_sq_sum"] == approx(total)
        assert [v for a in s["attention"] for v in a["toy_q_norm"]] == approx([v for x in sites for v in heads[x]])
        text = CliRunner().invoke(cli, ["stats", str(run_dir)], env={"COLUMNS": "240"}).output  # xdist sets COLUMNS=80
        assert "toy_q_norm" in text and "toy_block_norm" in text and "toy query norm" not in text
    finally:
        for m in TOYS:
            register_measurement(m)


def test_a_field_is_left_out_where_its_declaration_does_not_show_it():
    """show: where a declared field goes; one declared for the CLI only stays out of TensorBoard and
    the live sinks, while an undeclared number goes everywhere."""
    from diagnose.monitor._fields import flatten
    from diagnose.monitor._live import flatten as live
    from diagnose.schema import Field

    register_measurement(Measurement("toy_cli_only", ("x",), "model", ("toy_x",), _SquaredWeights,
                                     fields=(Field("toy_x", "toy x", per="model", show={"cli"}),)))
    try:
        rec = {"step": 3, "time": 1.0, "toy_x": 1.5, "other": 2.5, "attention": {"s": {"toy_q_norm": [1.0, 2.0]}}}
        assert flatten(rec) == {"toy_x": 1.5, "other": 2.5, "attention/s/toy_q_norm/head0": 1.0,
                                "attention/s/toy_q_norm/head1": 2.0}
        assert set(flatten(rec, place="tensorboard")) == {"other", "attention/s/toy_q_norm/head0",
                                                          "attention/s/toy_q_norm/head1"}
        assert set(live(rec)) == {"diagnose/other", "diagnose/attention/s/toy_q_norm/head0",
                                  "diagnose/attention/s/toy_q_norm/head1"}
    finally:
        unregister_measurement("toy_cli_only")
