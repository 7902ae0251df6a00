"""TrainingMonitor records checked against independent computations on a tiny model."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from diagnose._activations import hidden_stats
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.monitor._runfolder import RestartWarning
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx, output_scale, size_of

pytestmark = pytest.mark.numerics


def _model(**kw):
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11, **kw))


def _batch(B=3, T=6):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 11, (B, T), generator=g)  # [B, T]
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 4:] = 0  # padding in the first example
    return ids, mask


def _loss(model, ids, mask):
    logits = model(ids, attention_mask=mask)  # [B, T, V]
    return F.cross_entropy(logits[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))


def _norm_width(params) -> int:
    """The longest sum behind a float32 gradient norm (each parameter's squares are summed in
    float32 by _foreach_norm; the references sum in float64): the largest parameter's numel."""
    return max(p.numel() for p in params)


def _no_hooks(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               for m in model.modules())


def test_record_matches_independent_computation(tmp_path):
    model = _model()
    ids, mask = _batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    # independent reference: block outputs and attention maps through our own hooks
    outs, probs = {}, {}
    hs = [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o.detach())) for i, b in enumerate(model.blocks)]
    hs += [b.attn.pattern.register_forward_hook(lambda m, a, o, i=i: probs.__setitem__(i, o.detach()))
           for i, b in enumerate(model.blocks)]
    with TrainingMonitor(model, tmp_path, attention_every=1, clip=0.1, every=1, echo=False) as mon:
        loss = _loss(model, ids, mask)
        loss.backward()
        rec = mon.step(loss, optimizer=opt)
    for h in hs:
        h.remove()
    grads = {n: p.grad for n, p in model.named_parameters()}
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item()
    width = _norm_width(model.parameters())
    assert rec["grad_norm"] == approx(total, width=width)  # float32 sums of squares vs float64
    assert rec["clip_coef"] == approx(min(1.0, 0.1 / (total + 1e-6)), width=width)  # carries the norm's relative error
    assert rec["lr"] == 0.5 and rec["loss"] == loss.item()  # the same float32 loss, widened to float64: bit-equal
    for i in range(2):
        name = f"blocks.{i}"
        layer_gn = math.sqrt(sum((g.double() ** 2).sum().item() for n, g in grads.items() if n.startswith(name + ".")))
        assert rec["layers"][name]["grad_norm"] == approx(layer_gn, width=width)
        x = outs[i].double()  # [B, T, C]
        w = mask.double()[..., None]  # [B, T, 1]
        mean = (x * w).sum() / (w.sum() * x.shape[-1])
        var = (((x - mean) ** 2) * w).sum() / (w.sum() * x.shape[-1])
        expect = hidden_stats(outs[i], mask).tolist()
        got = rec["layers"][name]
        # the same block output: float32 row sums and norms over C channels vs float64 throughout;
        # the values summed are of size max |x| (the mean cancels), |x|^2 for the variance
        C, big = x.shape[-1], x.abs().max().item()
        assert got["act_mean"] == approx(mean.item(), scale=big, width=C)
        assert got["act_var"] == approx(var.item(), scale=big ** 2, width=C)
        assert got["act_max_abs"] == (x.abs() * w).max().item()  # a maximum of the same float32 values: exact
        # hidden_stats of the same output, alone here and batched over blocks in the monitor:
        # each block's reductions run in the same order, so bit-equal
        assert got["token_cos"] == expect[3]
        p = probs[i].double()  # [B, H, T, T]
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [B, H, T]
        q = mask.double()[:, None, :]  # real query rows
        want = ((ent * q).sum((0, 2)) / (q.sum() * 1)).tolist()
        att = rec["attention"][f"blocks.{i}.attn"]
        # the same maps: float32 -p log p summed over T keys, then over B * T query rows, vs float64
        rows = ids.numel()
        assert att["entropy"] == approx(want, width=rows)
        assert att["max_weight"] == approx(((p.amax(-1) * q).sum((0, 2)) / q.sum()).tolist(), width=rows)
    assert _no_hooks(model)
    run = read_run(tmp_path)
    assert run.steps.loc[0, "layers/blocks.1/grad_norm"] == rec["layers"]["blocks.1"]["grad_norm"]  # JSON round-trips a float exactly
    assert run.closed and run.info["model"]["blocks"] == ["blocks.0", "blocks.1"]


def test_one_host_sync_per_logged_step(tmp_path, monkeypatch):
    model = _model()
    ids, mask = _batch()
    calls = {"tolist": 0, "item": 0}
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(self):
        calls["tolist"] += 1
        return real_tolist(self)

    def item(self):
        calls["item"] += 1
        return real_item(self)

    with TrainingMonitor(model, tmp_path, attention_every=2, every=1, echo=False) as mon:
        for _ in range(4):
            loss = _loss(model, ids, mask)
            loss.backward()
            monkeypatch.setattr(torch.Tensor, "tolist", tolist)
            monkeypatch.setattr(torch.Tensor, "item", item)
            mon.step(loss)
            monkeypatch.undo()
            model.zero_grad()
    assert calls == {"tolist": 4, "item": 0}


def test_every_and_attention_every_and_hooks_removed(tmp_path):
    model = _model()
    ids, mask = _batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with TrainingMonitor(model, tmp_path, every=3, attention_every=6, echo=False) as mon:
        for s in range(8):
            loss = _loss(model, ids, mask)
            loss.backward()
            mon.step(loss)
            # the attention hooks exist only while a sampled step's forward is coming
            watching = bool(model.blocks[0].attn.pattern._forward_hooks)
            assert watching == ((s + 1) % 6 == 0), s
            model.zero_grad()
    assert _no_hooks(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # observing changes nothing
    run = read_run(tmp_path)
    assert run.steps["step"].tolist() == [0, 3, 6]
    assert sorted(run.attention["step"].unique()) == [0, 6]
    assert run.steps["lr"].isna().all()  # no optimizer, no lr given


def test_eval_forward_under_no_grad_is_not_counted(tmp_path):
    model = _model()
    ids, mask = _batch()
    with TrainingMonitor(model, tmp_path, attention_every=0, every=1, echo=False) as mon:
        loss = _loss(model, ids, mask)
        loss.backward()
        with torch.no_grad():
            model(ids * 0 + 1)  # a different batch, must not pollute the stats
        rec = mon.step(loss)
    with torch.no_grad():
        ref = []
        h = model.blocks[1].register_forward_hook(lambda m, a, o: ref.append(hidden_stats(o, mask)))
        model(ids, attention_mask=mask)
        h.remove()
    # a second forward of the same batch (no grad): up to blocks.1, the model's depth and width
    assert rec["layers"]["blocks.1"]["act_mean"] == approx(ref[0][0].item(), scale=output_scale(ref[0][2]),
                                                           **size_of(model))


def test_grad_scaler_norms_are_unscaled(tmp_path):
    model = _model()
    ids, mask = _batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss = _loss(model, ids, mask)
    loss.backward()
    plain = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
    model.zero_grad()
    with TrainingMonitor(model, tmp_path / "a", every=1, echo=False) as mon:
        loss = _loss(model, ids, mask)
        scaler.scale(loss).backward()
        rec = mon.step(loss, optimizer=opt, scaler=scaler)
        # a power-of-two loss scale scales the float32 gradients exactly: only the norm's float32
        # sums of squares differ from the float64 reference
        width = _norm_width(model.parameters())
        assert rec["grad_norm"] == approx(plain, width=width)
        scaler.unscale_(opt)  # already unscaled: must not be divided again
        rec = mon.step(loss, optimizer=opt, scaler=scaler)
        assert rec["grad_norm"] == approx(plain, width=width)


def test_restart_appends_and_says_so(tmp_path):
    model = _model()
    ids, mask = _batch()
    for session in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
                for s in range(3):
                    loss = _loss(model, ids, mask)
                    loss.backward()
                    mon.step(loss, step=10 * session + s)
                    model.zero_grad()
        restarts = [w for w in caught if issubclass(w.category, RestartWarning)]
        assert len(restarts) == session, [str(w.message) for w in caught]
    run = read_run(tmp_path)
    assert run.steps["step"].tolist() == [0, 1, 2, 10, 11, 12]
    assert run.steps["session"].tolist() == [0, 0, 0, 1, 1, 1]
    assert len(run.info["sessions"]) == 2 and run.closed
    assert "last logged step 2" in str(restarts[0].message)


def test_nonfinite_names_first_block_and_parameter(tmp_path):
    model = _model()
    ids, mask = _batch()
    with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
        loss = _loss(model, ids, mask)
        loss.backward()
        mon.step(loss)
        model.zero_grad()
        # a NaN gradient that no activation shows (e.g. an overflow in backward)
        loss = _loss(model, ids, mask)
        loss.backward()
        model.blocks[1].mlp.fc.weight.grad[0, 0] = float("inf")
        rec = mon.step(loss)
    assert math.isinf(rec["grad_norm"]) and rec["nonfinite_param"] == "blocks.1.mlp.fc.weight"
    run = read_run(tmp_path)
    assert [(a["kind"], a["step"], a["where"]) for a in run.alerts] == [("nonfinite", 1, "blocks.1.mlp.fc.weight")]
    assert math.isinf(run.steps.loc[1, "grad_norm"])  # kept in the log, not dropped


def test_hooks_removed_when_construction_fails(tmp_path):
    model = _model()
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(Exception):
        TrainingMonitor(model, tmp_path, every=1, echo=False)
    assert _no_hooks(model)


def test_micro_batches_pool_like_one_batch(tmp_path):
    model = _model()
    ids, _ = _batch(B=4)
    with TrainingMonitor(model, tmp_path, attention_every=0, every=1, echo=False) as mon:
        for half in (ids[:2], ids[2:]):  # gradient accumulation: two forwards, one step
            (_loss(model, half, torch.ones_like(half)) / 2).backward()
        rec = mon.step(None)
    out = []
    h = model.blocks[0].register_forward_hook(lambda m, a, o: out.append(o.detach().double()))
    with torch.no_grad():
        model(ids)
    h.remove()
    x = out[0]  # [4, T, C]: both halves at once
    got = rec["layers"]["blocks.0"]
    # two forwards of B=2 pooled vs one of B=4: one layer deep, d_model wide; the values summed
    # are of size max |x| (|x|^2 for the variance)
    size = {"depth": 1, "width": size_of(model)["width"]}
    big = output_scale(x)
    assert got["act_mean"] == approx(x.mean().item(), scale=big, **size)
    assert got["act_var"] == approx(x.var(unbiased=False).item(), scale=big ** 2, **size)
    assert got["act_max_abs"] == approx(x.abs().max().item(), scale=big, **size)
    assert rec["loss"] is None  # no loss given: null, and no alert
    assert read_run(tmp_path).alerts == []


def test_step_override_with_every_never_mixes_forwards(tmp_path):
    model = _model()
    ids, mask = _batch()
    other = torch.ones_like(ids)  # a very different batch for the unlogged step
    with TrainingMonitor(model, tmp_path, every=2, attention_every=2, echo=False) as mon:
        for s in (7, 8, 9, 10):  # resumed at step 7: its forward was armed for step 0
            loss = _loss(model, other, torch.ones_like(other)) if s == 7 else _loss(model, ids, mask)
            loss.backward()
            rec = mon.step(loss, step=s)
            if s == 8:
                ref = rec
            model.zero_grad()
    run = read_run(tmp_path)
    assert run.steps["step"].tolist() == [8, 10]
    assert sorted(run.attention["step"].unique()) == [8, 10]
    out = []
    h = model.blocks[0].register_forward_hook(lambda m, a, o: out.append(hidden_stats(o, mask)))
    with torch.no_grad():
        model(ids, attention_mask=mask)
    h.remove()
    # step 8 holds its own forward only: step 7's forward was dropped, not pooled in
    # a second forward of the same batch (no grad), one layer deep, d_model wide
    size, big = {"depth": 1, "width": size_of(model)["width"]}, output_scale(out[0][2])
    assert ref["layers"]["blocks.0"]["act_mean"] == approx(out[0][0].item(), scale=big, **size)
    assert ref["layers"]["blocks.0"]["act_var"] == approx(out[0][1].item(), scale=big ** 2, **size)
