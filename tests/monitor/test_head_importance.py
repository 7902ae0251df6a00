"""Heads over training: per-head importance, role shares and the in-context loss on sampled steps,
checked against independent computations (the ablation engine's own gradient importance, the role
statistics of attention_summary, a hand-written per-position cross-entropy), and the info events."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import diagnose
from diagnose.monitor import register_detector, unregister_detector
from diagnose.monitor._detect import Detector
from diagnose.zoo.config import ModelConfig
from diagnose.zoo.model import Transformer
from tests.tolerance import approx, assert_close

pytestmark = pytest.mark.numerics

V, T = 16, 16


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=V, max_len=T, n_layers=2, n_heads=2, d_model=16, d_ff=16))


def _one_step(tmp_path, model, x, **kw):
    mon = diagnose.TrainingMonitor(model, tmp_path / "run", every=1, attention_every=1, echo=False, **kw)
    logits = model(x)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    mon.step(loss)
    mon.close()
    return diagnose.read_run(tmp_path / "run"), logits.detach()


def _gated_importance(model, x):
    """Michel et al.'s E_b |d L_b / d gate| with a real gate per example and head on each projection's
    input (the heads side by side), L the batch-mean next-token loss: what the monitor must give."""
    gates = [torch.ones(x.shape[0], 1, 2, 1, requires_grad=True) for _ in model.blocks]

    def pre(g):
        return lambda _m, args: ((args[0].view(*args[0].shape[:2], 2, -1) * g).flatten(2),)
    handles = [b.attn.proj.register_forward_pre_hook(pre(g)) for b, g in zip(model.blocks, gates)]
    try:
        logits = model(x)
        F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad()
    return torch.stack([g.grad.abs().sum(0).flatten() for g in gates]).flatten()  # [layers * heads]


def test_importance_is_the_head_gates_gradient(tmp_path):
    model, x = _model(), torch.randint(0, V, (8, T))
    theirs = _gated_importance(model, x)
    run, _ = _one_step(tmp_path, model, x)
    mine = torch.tensor(run.attention.sort_values(["site", "head"])["importance"].to_numpy())
    assert_close(mine, theirs.double(), scale=float(theirs.max()), depth=2)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())  # every hook removed


def test_roles_and_in_context_loss_match_independent_computations(tmp_path):
    model = _model(1)
    x = torch.randint(0, V, (8, T // 2))
    x = torch.cat([x, x], 1)  # repeated random tokens: induction targets exist
    run, logits = _one_step(tmp_path, model, x)
    summary = diagnose.attention_summary(model, [{"input_ids": x}])
    a = run.attention.sort_values(["site", "head"])
    for stat in ("first_token", "prev_token", "induction", "duplicate_token"):
        theirs = [summary.stats[layer][stat][h] for layer in range(2) for h in range(2)]
        assert a[stat].tolist() == approx(theirs, scale=1.0, depth=2), stat
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1), reduction="none").view(8, T - 1)
    q = (T - 1) // 4
    early, late = ce[:, 1:1 + q].mean().item(), ce[:, T - 1 - q:].mean().item()
    last = run.steps.iloc[-1]
    assert [last["icl_early"], last["icl_late"], last["icl_score"]] == approx([early, late, late - early], scale=5.0)


def test_without_token_ids_the_shares_that_need_them_are_left_out(tmp_path):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    model = torch.nn.Sequential()  # a float-input model: no token ids, no induction share, no icl
    model.add_module("attn", _SelfAttention(mha))
    mon = diagnose.TrainingMonitor(model, tmp_path / "run", every=1, attention_every=1, echo=False)
    out = model(torch.randn(2, 6, 8))
    out.pow(2).mean().backward()
    mon.step(out.pow(2).mean())
    mon.close()
    cols = diagnose.read_run(tmp_path / "run").attention.dropna(axis=1, how="all").columns
    assert {"importance", "first_token", "prev_token"} <= set(cols)
    assert "induction" not in cols and "duplicate_token" not in cols
    assert "icl_score" not in diagnose.read_run(tmp_path / "run").steps.dropna(axis=1, how="all").columns


class _SelfAttention(torch.nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def test_info_events_are_named_per_head_at_their_own_sample():
    from diagnose.monitor._alerts import AlertEngine, Thresholds

    e = AlertEngine(Thresholds(), ["blocks.0"])
    site = "blocks.0.attn"
    recs = [{"step": s, "loss": 1.0, "layers": {"blocks.0": {}}, "icl_early": 3.0, "icl_late": late,
             "icl_score": late - 3.0, "attention": {site: {"importance": imp, "induction": ind}}}
            for s, (late, imp, ind) in enumerate([(3.0, [0.01, 0.01], [0.1, 0.1]), (3.0, [0.01, 0.01], [0.1, 0.1]),
                                                  (1.0, [0.5, 0.01], [0.1, 0.7]), (0.9, [0.6, 0.2], [0.8, 0.7])])]
    out = [a for r in recs for a in e.check(r)]
    got = {(a["kind"], a["step"], a["where"]) for a in out}
    assert got == {("head_vital", 2, "L0.H0"), ("induction_head", 2, "L0.H1"),
                   ("induction_phase_change", 2, "model"), ("induction_head", 3, "L0.H0")}
    assert {a["severity"] for a in out} == {"info"}


class _AlwaysInfo(Detector):
    kind, severity, hint = "toy_event", "info", "none"

    def check(self, rec, ctx, emit):
        emit(True, "model", "an event")


def test_an_info_event_never_trips_raise_on(tmp_path):
    register_detector(_AlwaysInfo)
    try:
        model, x = _model(), torch.randint(0, V, (2, T))
        mon = diagnose.TrainingMonitor(model, tmp_path / "run", every=1, echo=False, raise_on=("toy_event",))
        model(x).sum().backward()
        mon.step(1.0)  # the event fires and is written, and the step returns: events are not failures
        mon.close()
    finally:
        unregister_detector("toy_event")
    alerts = diagnose.read_run(tmp_path / "run").alerts
    assert [a["severity"] for a in alerts if a["kind"] == "toy_event"] == ["info"]


def test_the_live_sinks_carry_each_head_under_diagnose_heads(tmp_path):
    seen: dict[str, float] = {}
    model, x = _model(), torch.randint(0, V, (4, T))
    mon = diagnose.TrainingMonitor(model, tmp_path / "run", every=1, attention_every=1, echo=False,
                                   sinks=[diagnose.monitor.CallableSink(lambda s, step: seen.update(s))])
    logits = model(x)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    record = mon.step(loss)
    mon.close()
    for stat in ("importance", "prev_token", "induction"):
        assert seen[f"diagnose/heads/L1.H0/{stat}"] == record["attention"]["blocks.1.attn"][stat][0]


def test_stats_prints_the_heads_section_and_table_and_the_json_carries_it(tmp_path):
    import json

    from click.testing import CliRunner

    from diagnose.cli.main import cli

    _one_step(tmp_path, _model(), torch.randint(0, V, (4, T)))
    out = CliRunner().invoke(cli, ["stats", str(tmp_path / "run"), "--heads"], env={"COLUMNS": "240"})
    assert out.exit_code == 0, out.output
    assert "heads: no head event" in out.output and "heads over training" in out.output
    assert all(label in out.output for label in ("L0.H0", "L0.H1", "L1.H0", "L1.H1"))
    js = json.loads(CliRunner().invoke(cli, ["stats", str(tmp_path / "run"), "--json"]).output)
    assert js["heads"]["schema"] == "diagnose.run-heads/1" and js["heads"]["steps"] == [0]
    assert [h["label"] for h in js["heads"]["heads"]] == ["L0.H0", "L0.H1", "L1.H0", "L1.H1"]


def test_a_compiled_model_gets_no_head_hooks_and_stats_says_why(tmp_path):
    """Under torch.compile the heads and the in-context loss are not sampled: no hook of theirs, no
    warning at run time; the run's lacking signals name them, the reason and the fix."""
    import warnings

    from diagnose.monitor._lacking import lacking_lines

    model = _model()
    net = torch.compile(model, backend="eager")  # never called: the monitor only sees the wrapper
    with warnings.catch_warnings(record=True) as said_now:
        warnings.simplefilter("always")
        mon = diagnose.TrainingMonitor(net, tmp_path / "run", every=1, attention_every=1, echo=False)
    # torch < 2.13 warns that the max logit is not sampled; nothing may speak of the heads or in-context loss
    assert not [w for w in said_now if "importance" in str(w.message) or "icl" in str(w.message)]
    heads, icl = mon.probe("heads"), mon.probe("icl")
    assert heads.off and heads._handle is None and icl._handle is None
    assert heads._read not in mon.probe("attention").watch.readers
    logits = model(torch.randint(0, V, (2, T)))  # eager, as if traced: nothing armed, nothing written
    logits.pow(2).mean().backward()
    assert heads._stack is None
    mon.step(logits.pow(2).mean().detach())
    mon.close()
    said = "\n".join(lacking_lines(diagnose.read_run(tmp_path / "run")))
    assert "attention.*.importance" in said and "icl_score" in said
    assert "torch.compile" in said and "eager run" in said
