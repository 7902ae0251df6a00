"""TrainingMonitor on the client models (tests/clients/*), given nothing but the model: it finds their
attention and residual blocks on the first training step's own batch (a model without an
nn.Embedding cannot be traced on anything else), records attention and block statistics from that
step on, eager and compiled, and warns about nothing. Compiled runs are few and small (slow)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import diagnose
from diagnose.adapters.base import TRACED_HOOKS

from ..tolerance import approx
from . import mingpt, nanogpt, timm_vit, torchvision_vit, xtransformers
from .files import pixel_values

pytestmark = pytest.mark.numerics

STEPS = 3


def _tokens(model):
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(2))  # [B, T]

    def loss(net):
        out = net(ids, ids) if isinstance(model, (nanogpt.GPT, mingpt.GPT)) else net(ids)
        logits = out[0] if isinstance(out, tuple) else out  # [B, T, V]
        return F.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))
    return loss


def _images(model):
    x, y = pixel_values(4), torch.tensor([0, 1, 2, 3])
    return lambda net: F.cross_entropy(net(x), y)


CLIENTS = {
    "nanogpt": (lambda: nanogpt.make(flash=False), _tokens, [f"transformer.h.{i}" for i in range(2)],
                [f"transformer.h.{i}.attn" for i in range(2)]),
    "mingpt": (mingpt.make, _tokens, [f"transformer.h.{i}" for i in range(2)],
               [f"transformer.h.{i}.attn" for i in range(2)]),
    "xtransformers": (xtransformers.make, _tokens, [f"attn_layers.layers.{i}" for i in range(4)],
                      [f"attn_layers.layers.{i}.1.attend" for i in (0, 2)]),
    "timm": (timm_vit.make, _images, [f"blocks.{i}" for i in range(2)], [f"blocks.{i}.attn" for i in range(2)]),
    "torchvision": (torchvision_vit.make, _images, [f"encoder.layers.encoder_layer_{i}" for i in range(2)],
                    [f"encoder.layers.encoder_layer_{i}.self_attention" for i in range(2)]),
}


HEADS = {"nanogpt": 2, "mingpt": 2, "xtransformers": 2, "timm": 4, "torchvision": 4}  # their make()s


def _train(client: str, run_dir, compiled: bool = False) -> tuple[list[dict], dict]:
    make, task, _, _ = CLIENTS[client]
    model = make().train()
    loss_of = task(model)
    net = torch.compile(model, backend="aot_eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing is lost, so nothing to warn about
        with diagnose.TrainingMonitor(net, run_dir, attention_every=1, every=1, echo=False) as monitor:
            for _ in range(STEPS):
                loss = loss_of(net)
                loss.backward()
                monitor.step(loss, optimizer=opt)
                opt.step()
                opt.zero_grad()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules()), "hooks left"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((run_dir / "run.json").read_text())


def _assert_watched(records: list[dict], run: dict, client: str) -> None:
    _, _, blocks, sites = CLIENTS[client]
    assert run["model"]["blocks"] == blocks and run["model"]["attention_sites"] == sites
    assert [r["step"] for r in records] == list(range(STEPS))
    for r in records:  # from the first step on: the batch that found them is measured too
        assert list(r["attention"]) == sites
        for stats in r["attention"].values():
            assert len(stats["entropy"]) == HEADS[client]
            assert all(0.0 < e <= stats["uniform_entropy"] * (1 + 1e-6) for e in stats["entropy"])
        assert list(r["layers"]) == blocks
        assert all(v["act_var"] > 0 and v["grad_norm"] > 0 for v in r["layers"].values())


@pytest.mark.parametrize("client", list(CLIENTS))
def test_the_monitor_records_attention_and_blocks_from_the_first_batch(client, tmp_path):
    records, run = _train(client, tmp_path)
    _assert_watched(records, run, client)


def test_torchvision_block_statistics_read_the_residual_stream(tmp_path):
    """act_var of a block is the variance over every entry of EncoderBlock's output (the stream, as
    _activations.hidden_stats pools it), not of its attention module's output."""
    model = torchvision_vit.make().train()
    x = pixel_values(4)
    outs = {}
    hooks = [b.register_forward_hook(lambda m, _a, out, i=i: outs.setdefault(i, out.detach()))
             for i, b in enumerate(model.encoder.layers)]
    with diagnose.TrainingMonitor(model, tmp_path, attention_every=0, every=1, echo=False) as monitor:
        loss = model(x).pow(2).mean()
        loss.backward()
        record = monitor.step(loss)
    for h in hooks:
        h.remove()
    for i, stats in enumerate(record["layers"].values()):
        assert stats["act_var"] == approx(float(outs[i].double().var(unbiased=False)), width=32)


@pytest.mark.skipif(not TRACED_HOOKS, reason="diagnose's traced attention hooks need torch >= 2.13")
@pytest.mark.parametrize("client", ["xtransformers", "timm", "torchvision"])
def test_compiled_equals_eager(client, tmp_path):
    """x-transformers (the blocks are list items the parent unpacks), timm (no Embedding: found on the
    first batch, by a pre-hook that runs outside the compiled graph) and torchvision (nn.MultiheadAttention's
    traced hook), compiled: the eager run's numbers."""
    eager, _ = _train(client, tmp_path / "eager")
    got, run = _train(client, tmp_path / "compiled", compiled=True)
    _assert_watched(got, run, client)
    for a, b in zip(got, eager, strict=True):
        for site in b["attention"]:
            assert a["attention"][site]["entropy"] == approx(b["attention"][site]["entropy"], width=32, depth=2)
        for block in b["layers"]:
            assert a["layers"][block]["act_var"] == approx(b["layers"][block]["act_var"], width=32, depth=2)


def test_example_finds_them_when_the_monitor_is_made(tmp_path):
    model = timm_vit.make().train()
    with diagnose.TrainingMonitor(model, tmp_path, example=pixel_values(2), every=1, echo=False) as monitor:
        run = json.loads((tmp_path / "run.json").read_text())  # written before any training step
        assert run["model"]["attention_sites"] == CLIENTS["timm"][3] == monitor.site_names
        assert run["model"]["blocks"] == CLIENTS["timm"][2]


def test_a_step_before_any_forward_says_what_is_not_watched(tmp_path):
    model = timm_vit.make().train()
    monitor = diagnose.TrainingMonitor(model, tmp_path, every=1, echo=False)
    with pytest.warns(RuntimeWarning) as caught:
        monitor.step(torch.tensor(1.0))
    monitor.close()
    said = " ".join(str(w.message) for w in caught)
    assert "step() came before any forward" in said and "pass example=inputs" in said
    assert "records no attention statistics" in said and "does not start with an nn.Embedding" in said
    assert monitor.site_names == []
