"""Spike replay (issue 33): a run with a planted spike -- three examples of a batch given wrong targets and
one head's queries scaled 30x at the same step -- saved with save_spikes, then replayed through the CLI and
the library. The replay must reproduce the recorded step, name the planted head and examples, measure each
block's gradient norm as the parameters' own gradients say, and find that skipping the batch and a 10x lower
lr keep the held-out loss down while the run's own update (the no-op cure) does not."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from safetensors.torch import load_file

from diagnose.io import save_checkpoint
from diagnose.monitor import TrainingMonitor, read_run, render_replay, replay
from diagnose.monitor._replay_load import build_optimizer
from diagnose.monitor._spike_state import optimizer_state
from diagnose.monitor._spikes import save_spike
from diagnose.zoo import ModelConfig, Transformer
from ..cli.hostile import assert_refused, invoke
from ..tolerance import approx, assert_exact

pytestmark = pytest.mark.numerics

V, T, B, SPIKE, HEAD = 16, 12, 8, 60, 1
CFG = dict(vocab_size=V, max_len=T, n_layers=2, n_heads=2, d_model=16)
POISONED = {0, 1, 2}


def _batch(s: int, poison: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Counting sequences (the next token is this one + 1, mod V); poisoned: examples 0-2 get +7 instead."""
    start = torch.randint(0, V, (B, 1), generator=torch.Generator().manual_seed(s))
    x = (start + torch.arange(T)) % V  # [B, T]
    y = (x + 1) % V
    if poison:
        y[:3] = (x[:3] + 7) % V
    return x, y


def _train(run_dir, steps: int = SPIKE + 1, **kw) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**CFG))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    with TrainingMonitor(model, run_dir, echo=False, save_spikes=True, every=1, attention_every=5, **kw) as mon:
        for s in range(steps):
            x, y = _batch(s, poison=s == SPIKE)
            if s == SPIKE:
                with torch.no_grad():  # the planted head: its queries (rows HEAD*D.. of qkv's q part) x30
                    d = CFG["d_model"] // CFG["n_heads"]
                    model.blocks[1].attn.qkv.weight[HEAD * d:(HEAD + 1) * d] *= 30.0
            per = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(B, T).mean(1)  # [B]
            opt.zero_grad()
            per.mean().backward()
            mon.step(per.mean(), optimizer=opt, batch=(x, y), per_example_loss=per.detach())
            opt.step()
    return model


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay")
    _train(folder / "run")
    save_checkpoint(Transformer(ModelConfig(**CFG)), folder / "model.pt")  # the architecture; weights replaced
    return folder


def test_replay_names_the_planted_cause_and_cures(planted):
    res = invoke("stats", planted / "run", "--replay", SPIKE, "--model", planted / "model.pt", "--json")
    assert res.exit_code == 0, res.output
    view = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert view["schema"] == "diagnose.replay/1" and "loss_spike" in view["kinds"]
    r = view["reproduced"]
    assert r["loss_replayed"] == approx(r["loss_recorded"]) and r["grad_norm_replayed"] == approx(r["grad_norm_recorded"])
    top = view["heads"][0]
    assert (top["site"], top["head"]) == ("blocks.1.attn", HEAD) and top["logit_ratio"] > 10 > view["heads"][1]["logit_ratio"]
    assert {e["index"] for e in view["examples"][:3]} == POISONED
    cures = {c["cure"]: c for c in view["cures"]}
    assert cures["skip"]["kept_down"] and cures["lr/10"]["kept_down"] and not cures["none"]["kept_down"]
    assert cures["skip"]["loss_holdout"] == approx(view["before"]["holdout"])  # no update: nothing moved
    assert "blocks.1.attn #1 jumped" in view["verdict"] and "kept the loss down: skip, lr/10" in view["verdict"]


def test_block_norms_are_the_parameters_own(planted):
    """Each block's replayed gradient norm is the norm of its parameters' gradients, computed here on the
    saved state with nothing of diagnose but the file."""
    model = Transformer(ModelConfig(**CFG))
    view = replay(planted / "run", SPIKE, model).to_dict()
    state = load_file(str(planted / "run" / "spikes" / f"step_{SPIKE:08d}.state.safetensors"))
    model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    x, y = _batch(SPIKE, poison=True)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    for row in view["blocks"]:
        own = torch.stack([p.grad.norm() for p in model.get_submodule(row["block"]).parameters()]).norm()
        assert row["grad_norm"] == approx(float(own))
    assert sum(b["share"] for b in view["blocks"]) == approx(1.0)
    out = io.StringIO()
    render_replay(view, Console(file=out, width=200))  # the CLI's tables
    assert "cures (loss before the update" in out.getvalue() and view["verdict"] in out.getvalue()


@pytest.mark.parametrize("make", [lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.9)),
                                  lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)])
def test_optimizer_rebuilt_from_its_saved_state(make):
    """The optimizer rebuilt from the saved JSON and tensors makes the very update the original makes."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt, x = make(net.parameters()), torch.randn(5, 3)
    for _ in range(3):
        opt.zero_grad()
        net(x).square().sum().backward()
        opt.step()
    meta, tensors = optimizer_state(net, opt)
    meta = json.loads(json.dumps(meta))  # through strict JSON, as the folder holds it
    twin.load_state_dict(net.state_dict())
    again = build_optimizer(twin, meta, {k: v.clone() for k, v in tensors.items()}, None, "test")
    assert type(again) is type(opt)
    for m, o in ((net, opt), (twin, again)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for a, b in zip(net.parameters(), twin.parameters()):
        assert_exact(a, b)


def test_refusals_say_why(planted, tmp_path):
    run = planted / "run"
    assert_refused(invoke("stats", run, "--replay", SPIKE), "--model")
    assert_refused(invoke("stats", run, "--replay", SPIKE, "--model", planted / "model.pt", "--loss", "nosuch_mod:fn"),
                   "--loss nosuch_mod:fn")
    assert_refused(invoke("stats", run, "--replay", SPIKE - 1, "--model", planted / "model.pt"),
                   f"step {SPIKE - 1}", str(SPIKE))
    small = dict(CFG, d_model=8)
    save_checkpoint(Transformer(ModelConfig(**small)), tmp_path / "other.pt")
    assert_refused(invoke("stats", run, "--replay", SPIKE, "--model", tmp_path / "other.pt"), "not the run's")
    # a state over spike_bytes is not saved, and the record and the replay say so; an older folder's
    # record (no state field at all) is read, and the replay says why there is nothing to replay
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    net = Transformer(ModelConfig(**CFG))
    save_spike(copy, SPIKE, ["loss_spike"], _batch(SPIKE, True), None, 4096, model=net,
               optimizer=torch.optim.AdamW(net.parameters()))
    (spike,) = read_run(copy).spikes
    assert spike["state"] is None and "spike_bytes" in spike["state_note"]
    assert_refused(invoke("stats", copy, "--replay", SPIKE, "--model", planted / "model.pt"),
                   "no model state was saved", fix="spike_bytes")
    record = copy / "spikes" / f"step_{SPIKE:08d}.json"
    old = {k: v for k, v in json.loads(record.read_text()).items() if k not in ("state", "previous", "state_note")}
    record.write_text(json.dumps(old))
    assert read_run(copy).spikes[0]["step"] == SPIKE
    assert_refused(invoke("stats", copy, "--replay", SPIKE, "--model", planted / "model.pt"),
                   "written before spike replay existed")
