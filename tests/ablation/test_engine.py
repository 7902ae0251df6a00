"""The gate and the engine on the reference model: identity at 1, nothing left behind (also
after an error or Ctrl-C mid-sweep), mean ablation, gradient importance, --fast, token tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diagnose.ablation import SCHEMA, ablate_heads, ablate_methods
from diagnose.ablation.gate import close_heads, gated
from diagnose.ablation.result import ATTENTION_STATS
from diagnose.errors import ConfigError
from diagnose.objectives import default_task, targets_for
from diagnose.sites import find_heads

from .helpers import assert_untouched, evaluate, loss_tol, snapshot, with_head_weights_zeroed
from ..tolerance import F64, approx, assert_exact, size_of, tol

pytestmark = pytest.mark.numerics

V, T, N, H, D = 20, 7, 10, 4, 8


def test_open_gates_leave_output_bit_identical(model, data):
    with torch.no_grad():
        plain = model(**data)
        sites = find_heads(model)
        with gated(sites) as gates:
            for g, site in zip(gates, sites):
                g.scale = torch.ones(N, site.n_heads)
                fill = torch.randn(site.n_heads, site.head_dim)  # a fill is never used where the gate is 1
                g.fill = lambda head_out, rows, draw, fill=fill: fill
            same = model(**data)
    assert torch.equal(plain, same)


def test_close_heads_is_replica_major():
    s = close_heads([3], [], 2, [None, (0, 1), (0, 2)])[0]  # [K * B, H]
    assert s.tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 0, 1], [1, 1, 0], [1, 1, 0]]


def test_close_heads_shuts_the_base_in_every_replica_and_leaves_other_sites_open():
    first, second, third = close_heads([3, 2, 2], [(1, 0)], 1, [None, (0, 2), (1, 1)])  # [K * B, H] each
    assert first.tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 1]]
    assert second.tolist() == [[0, 1], [0, 1], [0, 0]]
    assert third is None  # nothing shut there: its gate is left untouched


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("fast", [False, True])
def test_nothing_left_after_an_interrupted_sweep(model, data, error, fast):
    model.train()  # the sweep switches to eval; the caller's mode must come back
    before = snapshot(model)

    def stop(event):
        if event.done >= 2:  # a step per head: the count may jump past 2
            raise error("stop")

    with pytest.raises(error):
        ablate_heads(model, data, task="lm", batch_size=3, progress=stop, attention=False, fast=fast, top=2)
    assert_untouched(model, before)


def test_nothing_left_after_ctrl_c_inside_a_replayed_forward(model, data):
    """Interrupt while block 0 replays and the layer-1 gate is closed (the one-example probe of the
    output's positions, the memory plan's probe, clean, layer 0, then layer 1)."""
    before = snapshot(model)
    calls = []

    def interrupt(_m, _args, _out):
        calls.append("forward" in model.blocks[0].__dict__)  # is block 0 replaying right now?
        if len(calls) == 5:
            raise KeyboardInterrupt

    handle = model.blocks[1].register_forward_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            ablate_heads(model, data, task="lm", batch_size=N, progress=False, attention=False)
    finally:
        handle.remove()
    assert calls == [False, False, False, False, True]
    assert_untouched(model, before)


def test_mean_ablation_equals_folding_the_mean_into_the_bias(model, data):
    """Independent: record the projection inputs, average per head over real tokens, and
    replace head h by zeroing its weight slice and adding W[:, slice] @ mean to the bias."""
    seen = {l: [] for l in range(2)}
    handles = [model.blocks[l].attn.proj.register_forward_pre_hook(lambda _m, a, l=l: seen[l].append(a[0]))
               for l in range(2)]
    with torch.no_grad():
        model(**data)
    for h in handles:
        h.remove()
    real = data["attention_mask"].bool()
    result = ablate_heads(model, data, task="lm", method="mean", batch_size=4, progress=False, attention=False)
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    base_acc, base_loss = evaluate(model, batches, "lm")
    for l in range(2):
        mean = seen[l][0][real].mean(0).view(H, D)  # [H, D] over real tokens of every example
        proj = model.blocks[l].attn.proj
        for h in range(H):
            bias = proj.bias.detach().clone()
            with torch.no_grad():
                proj.bias += proj.weight[:, h * D:(h + 1) * D] @ mean[h]
            try:
                acc, loss = with_head_weights_zeroed(proj.weight, 1, h, D, lambda: evaluate(model, batches, "lm"))
            finally:
                with torch.no_grad():
                    proj.bias.copy_(bias)
            got = result.head(l, h)
            assert got.delta_loss == pytest.approx(loss - base_loss, abs=loss_tol(loss, base_loss, **size_of(model)))
            assert got.delta_accuracy == approx(acc - base_acc, scale=1.0, dtype=F64)


def test_grad_importance_matches_finite_differences(model, data):
    """d loss_b / d xi_h by central differences on the head's weight slice (scaling the slice
    by 1 + e is exactly gate 1 + e), in float64; then Michel's E|.| and the per-layer norm."""
    model = model.double()
    result = ablate_heads(model, data, task="lm", batch_size=N, progress=False, attention=False)
    targets = targets_for("lm", data, None)

    def per_example(factor, l, h):
        w = model.blocks[l].attn.proj.weight
        saved = w.detach().clone()
        with torch.no_grad():
            w[:, h * D:(h + 1) * D] *= factor
            logits = model(**data)  # [N, T, V] float64
            w.copy_(saved)
        valid = targets != -100
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
        return (ce * valid).sum(1) / valid.sum(1)  # [N] mean loss per example

    eps = 1e-5
    # A central difference is not a second ordering of the same sum, so its margin is its own:
    # truncation, about eps^2 |f'''| / 6, held by the rel=1e-4 below, far above it and
    # far below a wrong gate (an error of order 1); and the rounding of the two float64 losses
    # divided by 2 eps, the policy's float64 tolerance at the losses' scale / eps (the abs= floor
    # for a head whose derivative is near 0).
    fd_rounding = tol(float(per_example(1.0, 0, 0).abs().max()) / eps, dtype=F64)
    raw = np.zeros((2, H))
    units = (targets != -100).sum(1).double()  # [N] scored units per example
    for l in range(2):
        for h in range(H):
            g = (per_example(1 + eps, l, h) - per_example(1 - eps, l, h)) / (2 * eps)  # [N]
            raw[l, h] = float(g.abs().mean())
            assert result.head(l, h).grad_importance_raw == pytest.approx(raw[l, h], rel=1e-4)
            # second order: (-sum_b dS_b + sum_b dS_b ** 2 / units_b / 2) / units, S_b = g_b * units_b summed loss
            d_sum = g * units
            want = float((-d_sum + 0.5 * d_sum ** 2 / units).sum() / units.sum())
            assert result.head(l, h).second_order_delta_loss == pytest.approx(want, rel=1e-4, abs=fd_rounding)
        norm = raw[l] / np.linalg.norm(raw[l])
        for h in range(H):
            assert result.head(l, h).grad_importance == pytest.approx(norm[h], rel=1e-4)


def test_fast_verifies_only_the_top_heads(model, data):
    full = ablate_heads(model, data, task="lm", progress=False, attention=False)
    fast = ablate_heads(model, data, task="lm", progress=False, attention=False, fast=True, top=3)
    key = fast.fast["ranked_by"]
    assert key == "second_order_delta_loss"  # the estimator that tracked exact ablation best (bench_estimators)
    by_estimate = sorted(full.heads, key=lambda h: -getattr(h, key))[:3]
    assert {(h.layer, h.head) for h in fast.heads if h.verified} == {(h.layer, h.head) for h in by_estimate}
    by_grad = ablate_heads(model, data, task="lm", progress=False, attention=False, fast=True, top=3,
                           rank_by="grad_importance_raw")
    want = {(h.layer, h.head) for h in sorted(full.heads, key=lambda h: -h.grad_importance_raw)[:3]}
    assert {(h.layer, h.head) for h in by_grad.heads if h.verified} == want
    for h in fast.heads:
        ref = full.head(h.layer, h.head)
        assert h.grad_importance_raw == approx(ref.grad_importance_raw, **size_of(model))
        assert h.estimated_delta_loss == approx(ref.estimated_delta_loss, **size_of(model))
    verified = [h for h in fast.heads if h.verified]
    assert len(verified) == 3
    for h in verified:
        ref = full.head(h.layer, h.head)
        assert h.delta_loss == pytest.approx(ref.delta_loss, abs=loss_tol(h.loss, ref.loss, **size_of(model)))
        assert h.kl == pytest.approx(ref.kl, abs=loss_tol(h.loss, ref.loss, **size_of(model)))
    assert all(h.delta_loss is None and h.p_value is None for h in fast.heads if not h.verified)
    assert fast.fast["spearman_vs_exact"]["n"] == 3
    assert full.correlations["fast_vs_exact"]["n"] == 2 * H
    assert fast.significance["n_tested"] == 3
    assert fast.timing["examples_forwarded"] < full.timing["examples_forwarded"]
    ranked = fast.ranked()
    assert [h.verified for h in ranked] == [True] * 3 + [False] * (2 * H - 3)
    rest = [h.second_order_delta_loss for h in ranked[3:]]
    assert rest == sorted(rest, reverse=True)
    verified = [h.delta_loss for h in ranked[:3]]
    assert verified == sorted(verified, reverse=True)
    none = ablate_heads(model, data, task="lm", progress=False, attention=False, fast=True, top=0)
    assert not any(h.verified for h in none.heads)


def test_token_classification_ignores_minus_100(model, data):
    labels = torch.randint(0, V, (N, T), generator=torch.Generator().manual_seed(5))
    labels[data["attention_mask"] == 0] = -100
    labels[:, 0] = -100
    pairs = [({k: v[i:i + 4] for k, v in data.items()}, labels[i:i + 4]) for i in range(0, N, 4)]
    result = ablate_heads(model, pairs, task="classification", progress=False, attention=False)
    assert result.n_units == int((labels != -100).sum())
    base_acc, base_loss = evaluate(model, pairs, "classification")
    assert result.baseline["loss"] == pytest.approx(base_loss, abs=loss_tol(base_loss, **size_of(model)))
    acc, loss = with_head_weights_zeroed(model.blocks[1].attn.proj.weight, 1, 2, D,
                                         lambda: evaluate(model, pairs, "classification"))
    assert result.head(1, 2).delta_loss == pytest.approx(loss - base_loss, abs=loss_tol(loss, base_loss, **size_of(model)))


def test_kl_is_clean_against_ablated_per_scored_unit(model, data):
    result = ablate_heads(model, data, task="lm", progress=False, attention=False)
    targets = targets_for("lm", data, None)
    valid = targets != -100
    with torch.no_grad():
        p = torch.log_softmax(model(**data), -1)[valid]  # [U, V]
        w = model.blocks[0].attn.proj.weight
        q = with_head_weights_zeroed(w, 1, 1, D, lambda: torch.log_softmax(model(**data), -1)[valid])
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    assert result.head(0, 1).kl == pytest.approx(kl, abs=loss_tol(kl, **size_of(model)))  # a difference of losses


def test_json_and_frame(model, data):
    result = ablate_heads(model, data, task="lm", progress=False, keep=2)
    out = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert out["schema"] == SCHEMA
    for key in ("model", "task", "method", "n_examples", "baseline", "heads", "correlations", "flags", "timing"):
        assert key in out
    assert out["model"] == {"family": "reference", "n_layers": 2, "n_heads": H, "class": "Transformer"}
    assert set(out["timing"]) >= {"seconds", "forward_passes"}
    head = out["heads"][0]
    for key in ("layer", "head", "accuracy", "delta_accuracy", "delta_accuracy_ci", "p_value", "loss", "delta_loss",
                "kl", "grad_importance", "attention"):
        assert key in head
    assert set(head["attention"]) == set(ATTENTION_STATS)
    assert all(v is not None for v in head["attention"].values())
    for stat in ATTENTION_STATS:
        assert set(out["correlations"][stat]) == {"rho", "p_value", "n"}
    assert len(out["examples"]) == 2
    ex = out["examples"][0]
    real = int(data["attention_mask"][0].sum())
    assert len(ex["tokens"]) == real and len(ex["attention"]) == 2
    assert np.array(ex["attention"][1]).shape == (H, real, real)
    # the JSON keeps 4 decimals (ablation/attention.py): a row's sum is 1 within real half-quanta, not eps
    assert np.abs(np.array(ex["attention"][0]).sum(-1) - 1).max() <= real * 0.5e-4 + tol(1.0, width=real)
    frame = result.to_frame()
    assert len(frame) == 2 * H and {"delta_accuracy", "delta_accuracy_ci_low", "attn_entropy"} <= set(frame.columns)
    high = [h.delta_loss_ci[1] for h in result.heads]  # the interval's columns are the heads' own numbers
    assert_exact(torch.tensor(frame["delta_loss_ci_high"].tolist()), torch.tensor(high))


def test_every_head_field_is_declared_once_for_the_readers():
    """HeadEffect writes the keys that diagnose/head_fields.py declares, no more and no fewer, in one order."""
    from dataclasses import fields

    from diagnose.ablation.result import HeadEffect
    from diagnose.head_fields import head_keys

    assert sorted(f.name for f in fields(HeadEffect)) == sorted(head_keys())
    assert len(set(head_keys())) == len(head_keys())


def test_every_document_key_is_declared(model, data):
    """HeadsResult's JSON writes the top-level keys head_fields.py declares, each of its declared kind."""
    from diagnose import head_fields as d

    out = ablate_methods(model, data, ["zero", "mean"], task="lm").to_json()  # with `agreement`
    declared = (*d.DOCUMENT_WORDS, *d.DOCUMENT_COUNTS, *d.DOCUMENT_OBJECTS, *d.DOCUMENT_LISTS)
    assert sorted(out) == sorted(declared)
    assert all(isinstance(out[k], str) for k in d.DOCUMENT_WORDS)
    assert all(isinstance(out[k], int) for k in d.DOCUMENT_COUNTS)
    assert all(out[k] is None or isinstance(out[k], dict) for k in d.DOCUMENT_OBJECTS)
    assert all(isinstance(out[k], list) for k in d.DOCUMENT_LISTS)


def test_bad_settings_and_default_task(model, data):
    with pytest.raises(ConfigError):
        ablate_heads(model, data, task="regression", progress=False)
    with pytest.raises(ConfigError):
        ablate_heads(model, data, method="nonesuch", progress=False)  # resample is a method now
    assert default_task(model, data) == "lm"
    assert default_task(model, {**data, "labels": torch.zeros(N, dtype=torch.long)}) == "classification"
    model.diagnose_meta = {"task": "classification"}
    assert default_task(model, data) == "classification"


def test_fast_recomputes_clean_passes_when_they_do_not_fit(model, data, monkeypatch):
    from diagnose.ablation import steps

    kept = ablate_heads(model, data, task="lm", batch_size=3, progress=False, attention=False, fast=True, top=3)
    monkeypatch.setattr(steps, "KEEP_BYTES", 0)
    redone = ablate_heads(model, data, task="lm", batch_size=3, progress=False, attention=False, fast=True, top=3)
    assert redone.timing["forward_passes"] > kept.timing["forward_passes"]
    assert [a.verified for a in kept.heads] == [b.verified for b in redone.heads]
    verified = [(a, b) for a, b in zip(kept.heads, redone.heads) if a.verified]
    assert len(verified) == 3
    for a, b in verified:
        tol = loss_tol(a.loss, b.loss, **size_of(model))
        assert a.delta_loss == pytest.approx(b.delta_loss, abs=tol) and a.kl == pytest.approx(b.kl, abs=tol)


def test_together_is_part_of_the_result(model, data):
    from diagnose.ablation import ablate_together

    groups = [[(0, 1), (1, 2)], [(1, 0)]]
    result = ablate_heads(model, data, task="lm", batch_size=4, progress=False, attention=False, together=groups)
    alone = [ablate_together(model, data, g, task="lm", batch_size=4).to_json() for g in groups]
    assert [g["heads"] for g in result.together] == [g["heads"] for g in alone]
    for got, want in zip(result.together, alone):
        assert got["delta_loss"] == pytest.approx(want["delta_loss"], abs=loss_tol(want["loss"], got["loss"], **size_of(model)))
    assert result.to_json()["together"] == result.together
    with pytest.raises(ConfigError):  # a head that does not exist fails before the sweep
        ablate_heads(model, data, task="lm", progress=False, together=[[(0, H)]])
