"""The AblationMethod registry: a method registered by a test is offered by the CLI and runs through the
one gate, equal to replacing the head's output by hand; and `close_heads`, which serves the sweep,
`ablate_together` and prune, closes a head exactly as zeroing its output-projection weights does."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from click.testing import CliRunner

from diagnose.ablation import AblationConfig, ablate_heads, ablate_together
from diagnose.ablation.gate import gated
from diagnose.ablation.plan import footprint
from diagnose.ablation.methods import FOLDABLE, METHODS, AblationMethod, get_method, register_method, unregister_method
from diagnose.ablation.sweep import Sweep
from diagnose.errors import ConfigError, DiagnoseError, UsageError
from diagnose.prune._measure import Measure
from diagnose.sites import find_heads

from .helpers import evaluate, loss_tol, with_head_weights_zeroed
from .test_engine import D, H, N  # noqa: F401  (the reference model and its padded data)
from ..tolerance import F64, approx, assert_close, size_of

pytestmark = pytest.mark.numerics

STEP = 0.05  # the toy fill: every coordinate of a closed head's output becomes STEP * (the example's index)


def _by_example(state, site, head_out, rows, draw):
    """The toy: a fill that differs per example (so it must follow the rows through replicas and
    micro-batches), [B, 1, 1, 1] broadcast over positions, heads and features."""
    assert rows is not None and rows.shape[0] == head_out.shape[0], "the gate did not get the batch's rows"
    return (STEP * rows.to(head_out.dtype))[:, None, None, None]


@pytest.fixture
def toy():
    method = register_method(AblationMethod("by-example", "each example's index times 0.05", _by_example))
    try:
        yield method
    finally:
        unregister_method(method.name)
    assert "by-example" not in METHODS


def test_a_registered_method_is_offered_by_both_commands_where_it_may_be(toy):
    from diagnose.cli.main import cli as main

    assert "by-example" in METHODS and "by-example" not in FOLDABLE  # not foldable: prune must not offer it
    heads_help = CliRunner().invoke(main, ["heads", "--help"]).output
    prune_help = CliRunner().invoke(main, ["prune", "--help"]).output
    assert "by-example" in heads_help and "each example's index" in " ".join(heads_help.split())
    assert "by-example" not in prune_help
    refused = CliRunner().invoke(main, ["heads", "m.pt", "--data", "d.pt", "--method", "nonesuch"])
    assert refused.exit_code == 2 and "by-example" in refused.output


def test_a_registered_method_runs_through_the_gate_and_equals_replacing_the_output_by_hand(toy, model, data):
    """Independent: a pre-hook on the output projection overwrites head h's slice of its input with
    STEP * the example's index; batches of 4 and a sweep cut into replicas and micro-batches."""
    fp = footprint(model, find_heads(model), {k: v[:1] for k, v in data.items()})
    result = ablate_heads(model, data, task="lm", method="by-example", batch_size=4, attention=False,
                          max_memory=fp.step_bytes(2, 3))
    assert result.method == "by-example"
    assert result.timing["micro_batch"] < 4 and result.timing["replication"] > 1  # cut, and replicated
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    base_acc, base_loss = evaluate(model, batches, "lm")
    for layer in range(2):
        for h in range(H):
            start = [0]

            def replace(_m, args, h=h):
                x = args[0].clone()  # [B, T, H * D]
                B = x.shape[0]
                rows = torch.arange(start[0], start[0] + B, dtype=x.dtype)
                x[:, :, h * D:(h + 1) * D] = STEP * rows[:, None, None]
                start[0] += B
                return (x,)

            handle = model.blocks[layer].attn.proj.register_forward_pre_hook(replace)
            try:
                acc, loss = evaluate(model, batches, "lm")
            finally:
                handle.remove()
            got = result.head(layer, h)
            assert got.delta_loss == pytest.approx(loss - base_loss, abs=loss_tol(loss, base_loss, **size_of(model)))
            assert got.delta_accuracy == approx(acc - base_acc, scale=1.0, dtype=F64)
    group = ablate_together(model, data, [(layer, h)], task="lm", method="by-example", batch_size=4)
    assert group.loss == pytest.approx(loss, abs=loss_tol(loss, **size_of(model)))  # the same fill, closed at once


def _by_draw(state, site, head_out, rows, draw):
    """A toy random fill: draw d sets every coordinate of a closed head's output to (d + 1) * STEP * 10."""
    return torch.full_like(head_out[:1, :1], (draw + 1) * STEP * 10)


def test_a_method_s_draws_are_averaged_per_example(model, data):
    """Two draws: each head's loss is the mean of the two losses with the output replaced by hand."""
    method = register_method(AblationMethod("two-draws", "a constant per draw", _by_draw, draws=2))
    try:
        result = ablate_heads(model, data, task="lm", method="two-draws", batch_size=4, attention=False)
        group = ablate_together(model, data, [(1, 0)], task="lm", method="two-draws", batch_size=4)
    finally:
        unregister_method(method.name)
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    _, base_loss = evaluate(model, batches, "lm")
    wants = []
    for h in range(H):
        losses = []
        for draw in range(2):
            def replace(_m, args, h=h, value=(draw + 1) * STEP * 10):
                x = args[0].clone()  # [B, T, H * D]
                x[:, :, h * D:(h + 1) * D] = value
                return (x,)

            handle = model.blocks[1].attn.proj.register_forward_pre_hook(replace)
            try:
                losses.append(evaluate(model, batches, "lm")[1])
            finally:
                handle.remove()
        want = sum(losses) / 2
        wants.append(want)
        assert result.head(1, h).delta_loss == pytest.approx(want - base_loss,
                                                             abs=loss_tol(want, base_loss, **size_of(model)))
    assert group.loss == pytest.approx(wants[0], abs=loss_tol(wants[0], **size_of(model)))  # the group is (1, 0)
    with pytest.raises(ConfigError, match="draws"):
        AblationMethod("bad", "a foldable fill with draws", _by_draw, foldable=True, draws=2)


def test_close_heads_closes_a_head_as_zeroing_its_output_projection_weights_does(model, data):
    """The sweep's clean pass with a base of closed heads (what ablate_together and prune run), prune's
    measure, and ablate_together, each against the head's input slice of the projection zeroed."""
    sites = find_heads(model)
    inputs = data
    layer, head = 1, 2
    with torch.no_grad():
        want = with_head_weights_zeroed(model.blocks[layer].attn.proj.weight, 1, head, D, lambda: model(**inputs))
    with gated(sites) as gates:
        clean = Sweep(model, sites, gates, "lm", reuse=False, closed=[(layer, head)]).clean(
            inputs, None, grad=False, record=False)
        measure = Measure(model, sites, [(inputs, None)], "lm")
        pruned_view = torch.cat([c.logits for c in measure.clean(measure.sweep(gates, [(layer, head)]))])
    assert_close(clean.logits, want, **size_of(model))
    assert_close(pruned_view, want, **size_of(model))
    group = ablate_together(model, data, [(layer, head)], task="lm")
    acc, loss = with_head_weights_zeroed(model.blocks[layer].attn.proj.weight, 1, head, D,
                                         lambda: evaluate(model, [(inputs, None)], "lm"))
    assert group.loss == pytest.approx(loss, abs=loss_tol(loss, **size_of(model)))
    assert group.accuracy == approx(acc, scale=1.0, dtype=F64)


def test_the_sweep_ablates_on_top_of_its_closed_base(model, data):
    """Closing (0, 1) as the base and ablating (1, 3) in a replica equals closing both at once."""
    sites = find_heads(model)
    inputs = data
    with gated(sites) as gates:
        sweep = Sweep(model, sites, gates, "lm", replication=2, closed=[(0, 1)])
        clean = sweep.clean(inputs, None, grad=False, record=True)
        m = sweep.heads.index((1, 3))
        ablated = sweep.ablate(clean, [m - 1, m])[m]
        both = Sweep(model, sites, gates, "lm", reuse=False, closed=[(0, 1), (1, 3)]).clean(
            inputs, None, grad=False, record=False)
    assert_close(ablated.loss_sum, both.loss_sum, **size_of(model))


def test_unknown_and_duplicate_methods_are_config_errors():
    with pytest.raises(ConfigError, match="zero, mean, resample"):
        get_method("nonesuch")
    with pytest.raises(ConfigError, match="already registered"):
        register_method(AblationMethod("zero", "again", get_method("zero").fill))
    with pytest.raises(ConfigError, match="method 'nope'"):
        AblationConfig(method="nope")


def test_options_live_in_one_config(model, data):
    """Keywords map onto AblationConfig; a whole config works the same; an unknown keyword is a UsageError."""
    by_keywords = ablate_heads(model, data, task="lm", batch_size=4, attention=False, fast=True, top=2)
    by_config = ablate_heads(model, data, config=AblationConfig(task="lm", batch_size=4, attention=False, fast=True,
                                                                top=2))
    assert [h.delta_loss for h in by_keywords.heads] == [h.delta_loss for h in by_config.heads]
    with pytest.raises(UsageError, match="unexpected keyword argument 'batchsize'"):
        ablate_heads(model, data, task="lm", batchsize=4)
    with pytest.raises(UsageError, match="progress"):
        ablate_heads(model, data, task="lm", progress=True)


def test_progress_events_count_every_step_and_say_the_plan(model, data):
    """A step (progress.ProgressEvent): a batch's data pass for the mean, then one head ablated on one batch,
    told a layer's heads at a time (Sweep.ablate ticks len(heads) at once)."""
    events = []
    ablate_heads(model, data, task="lm", method="mean", batch_size=5, attention=False, progress=events.append)
    notes = [e.note for e in events if e.note is not None]
    steps = [e for e in events if e.note is None and e.stage is None]  # the sweep's own
    assert len(notes) == 1 and "head(s) per forward" in notes[0] and "micro-batch 5 of 5" in notes[0]
    batches, n_layers = -(-N // 5), len(model.blocks)
    data_pass = list(range(1, batches + 1))  # a step per batch
    per_layer = [batches + H * k for k in range(1, batches * n_layers + 1)]  # then H steps per layer per batch
    assert [e.done for e in steps] == data_pass + per_layer
    assert steps[-1].done == steps[-1].total == batches * (1 + n_layers * H)
    assert {e.first for e in steps} == {batches + n_layers * H}  # the data pass and the first batch's heads


class _Deaf:
    """An adapter that installs no gate: the adapter bug the silent-gate check exists for."""

    def __init__(self, adapter):
        self.adapter = adapter

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def intervene(self, site, gate):
        return contextlib.nullcontext()


@pytest.mark.parametrize("where", ["sweep", "together", "prune"])
def test_a_gate_that_never_fires_is_caught_everywhere(model, data, where):
    from diagnose import prune_heads

    sites = find_heads(model)
    sites[1] = dataclasses.replace(sites[1], adapter=_Deaf(sites[1].adapter))
    run = {"sweep": lambda: ablate_heads(model, data, task="lm", sites=sites, attention=False),
           "together": lambda: ablate_together(model, data, [(0, 1)], task="lm", sites=sites),
           "prune": lambda: prune_heads(model, data, task="lm", sites=sites, limit=1)}[where]
    with pytest.raises(DiagnoseError, match="'blocks.1.attn' was never applied"):
        run()
