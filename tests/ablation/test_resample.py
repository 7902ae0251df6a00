"""Resample ablation against replacing each head's output by hand with another example's output on the
same head: the seeded donors, several draws averaged, padding, micro-batches and replicas, --fast,
ablate_together; and what resample refuses (prune, draws on a constant fill, one example)."""

from __future__ import annotations

import pytest
import torch

from diagnose.ablation import AblationConfig, ablate_heads, ablate_together
from diagnose.ablation.plan import footprint
from diagnose.ablation.resample import choose_donors
from diagnose.errors import ConfigError
from diagnose.prune import prune_heads
from diagnose.sites import find_heads

from .helpers import evaluate, loss_tol
from ..tolerance import size_of
from .test_engine import D, H, N, T  # the reference model's sizes (its fixtures are in conftest.py)

pytestmark = pytest.mark.numerics

DRAWS, SEED = 3, 11


def _clean_outputs(model, data) -> list[torch.Tensor]:
    """Per layer, every example's head outputs [N, T, H, D] as the output projection receives them."""
    got: list[torch.Tensor] = []
    handles = [b.attn.proj.register_forward_pre_hook(lambda _m, args: got.append(args[0].detach().clone()))
               for b in model.blocks]
    try:
        with torch.no_grad():
            model(**data)
    finally:
        for handle in handles:
            handle.remove()
    return [x.view(N, T, H, D) for x in got]


def _by_hand(model, data, layer: int, head: int, draws: int, seed: int) -> float:
    """The mean over draws of the loss with head's output on example r replaced by its donor's: the donor's
    output where the donor has a real token, its mean over its real tokens at its padding."""
    outs = _clean_outputs(model, data)[layer][:, :, head]  # [N, T, D]
    mask = data["attention_mask"].float()[:, :, None]  # [N, T, 1]
    means = (outs * mask).sum(1) / mask.sum(1)  # [N, D]
    pool, table = choose_donors(N, draws, seed)
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    losses = []
    for draw in range(draws):
        donor = pool[table[:, draw]]  # [N] data set index of each example's donor
        fill = torch.where(mask[donor] > 0, outs[donor], means[donor][:, None])  # [N, T, D]
        start = [0]

        def replace(_m, args):
            x = args[0].clone()  # [B, T, H * D]
            B = x.shape[0]
            x[:, :, head * D:(head + 1) * D] = fill[start[0]:start[0] + B]
            start[0] += B
            return (x,)

        handle = model.blocks[layer].attn.proj.register_forward_pre_hook(replace)
        try:
            losses.append(evaluate(model, batches, "lm")[1])
        finally:
            handle.remove()
    return sum(losses) / draws


def test_donors_are_seeded_never_the_example_itself_and_come_from_a_bounded_pool():
    pool, table = choose_donors(200, 4, 7, pool_size=16)
    again = choose_donors(200, 4, 7, pool_size=16)
    assert torch.equal(pool, again[0]) and torch.equal(table, again[1])
    assert not torch.equal(table, choose_donors(200, 4, 8, pool_size=16)[1])
    assert pool.numel() == 16 and len(set(pool.tolist())) == 16 and table.shape == (200, 4)
    assert bool((pool[table] != torch.arange(200)[:, None]).all())
    with pytest.raises(ConfigError, match="at least 2 examples"):
        choose_donors(1, 2, 0)


def test_resample_equals_replacing_each_output_by_another_example_s_by_hand(model, data):
    """Batches of 4, cut further into micro-batches and replicas: the rows follow every cut."""
    fp = footprint(model, find_heads(model), {k: v[:1] for k, v in data.items()})
    result = ablate_heads(model, data, task="lm", method="resample", draws=DRAWS, seed=SEED, batch_size=4,
                          attention=False, max_memory=fp.step_bytes(2, 3))
    assert result.method == "resample"
    assert result.timing["micro_batch"] < 4 and result.timing["replication"] > 1
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    _, base_loss = evaluate(model, batches, "lm")
    for layer in range(2):
        for head in range(H):
            want = _by_hand(model, data, layer, head, DRAWS, SEED)
            got = result.head(layer, head).delta_loss
            assert got == pytest.approx(want - base_loss, abs=loss_tol(want, base_loss, **size_of(model)))
    group = ablate_together(model, data, [(1, 2)], task="lm", method="resample", draws=DRAWS, seed=SEED,
                            batch_size=4)
    want = _by_hand(model, data, 1, 2, DRAWS, SEED)
    assert group.loss == pytest.approx(want, abs=loss_tol(want, **size_of(model)))


def test_resample_is_deterministic_with_a_seed_and_fast_verifies_the_same_effects(model, data):
    one = ablate_heads(model, data, task="lm", method="resample", seed=4, batch_size=4, attention=False)
    two = ablate_heads(model, data, task="lm", method="resample", seed=4, batch_size=4, attention=False)
    other = ablate_heads(model, data, task="lm", method="resample", seed=5, batch_size=4, attention=False)
    assert [h.delta_loss for h in one.heads] == [h.delta_loss for h in two.heads]
    assert [h.delta_loss for h in one.heads] != [h.delta_loss for h in other.heads]
    fast = ablate_heads(model, data, task="lm", method="resample", seed=4, batch_size=4, attention=False,
                        fast=True, top=3)
    verified = [h for h in fast.heads if h.verified]
    assert len(verified) == 3
    for h in verified:
        want = one.head(h.layer, h.head).delta_loss
        assert h.delta_loss == pytest.approx(want, abs=loss_tol(want, **size_of(model)))


def test_resample_is_refused_where_it_cannot_work(model, data):
    with pytest.raises(ConfigError, match="folded"):
        prune_heads(model, data, task="lm", method="resample")
    with pytest.raises(ConfigError, match="draws"):
        AblationConfig(method="zero", draws=2)
    with pytest.raises(ConfigError, match="draws"):
        AblationConfig(method="resample", draws=0)
    one = {k: v[:1] for k, v in data.items()}
    with pytest.raises(ConfigError, match="at least 2 examples"):
        ablate_heads(model, one, task="lm", method="resample", attention=False)


def test_methods_share_one_sweep_and_equal_separate_sweeps(model, data):
    """ablate_methods runs every method in one sweep (the clean passes and prefixes computed once): each
    method's per-head effects equal its own ablate_heads run, with fewer forward passes than the three
    sweeps together."""
    from diagnose.ablation import ablate_methods

    options = dict(task="lm", batch_size=4, seed=SEED, attention=False, direct=False)
    both = ablate_methods(model, data, ["zero", "mean", "resample"], draws=DRAWS, **options)
    alone = {m: ablate_heads(model, data, method=m, draws=DRAWS if m == "resample" else None, **options)
             for m in ("zero", "mean", "resample")}
    first = alone["zero"]
    loss_tolerance = loss_tol(first.baseline["loss"], *(h.loss for r in alone.values() for h in r.heads),
                              **size_of(model))
    rows = {(r["layer"], r["head"]): r for r in both.agreement["heads"]}
    for m, res in alone.items():
        for h in res.heads:
            assert rows[(h.layer, h.head)]["delta_loss"][m] == pytest.approx(h.delta_loss, abs=loss_tolerance)
            assert rows[(h.layer, h.head)]["verdicts"][m] == h.verdict
    assert [h.grad_importance for h in both.heads] == pytest.approx([h.grad_importance for h in first.heads],
                                                                    abs=loss_tolerance)
    separate = sum(r.timing["forward_passes"] for r in alone.values())
    assert both.timing["forward_passes"] < separate
    assert both.timing["shared_methods"] == ["zero", "mean", "resample"]
