"""Direct effects of models no adapter declares a path for (adapters/_stream.py, ablation/direct_clamp.py)
against a hand computation: the model run with the head's output-projection slice zeroed, every later
sublayer (named here by hand, per model) returning its clean output, and every norm of the layers and
the final norm normalising with its clean input's scale. The output layers run as they are."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.ablation import ablate_heads
from diagnose.objectives import call_model, logits_of, score, targets_for
from diagnose.zoo import ModelConfig, Transformer

from ..nano import nanogpt
from diagnose._tolerance import model_size

from ..tolerance import loss_tol, size_of
from .helpers import assert_untouched, snapshot, with_head_weights_zeroed
from .planted_takeover import OddRMSNorm, planted_takeover, takeover_data, with_unknown_norm

pytestmark = pytest.mark.numerics


def losses(model: nn.Module, batch: tuple, task: str) -> torch.Tensor:
    """Per-example loss sums of one plain forward of batch = (inputs, labels or None).  # [N]"""
    inputs, labels = batch
    with torch.no_grad():
        return score(logits_of(call_model(model, inputs)), targets_for(task, inputs, labels)).loss_sum


def frozen(norm: nn.Module, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A norm's output on x with its scale sigma held: a LayerNorm (torch's, nanoGPT's own), or Gemma's RMSNorm
    (x / rms * (1 + weight))."""
    if _gemma(norm):
        return (x.float() / sigma * (1.0 + norm.weight.float())).to(x.dtype)
    out = (x - x.mean(-1, keepdim=True)) / sigma
    out = out if norm.weight is None else out * norm.weight
    return out if norm.bias is None else out + norm.bias


def _gemma(norm: nn.Module) -> bool:
    return type(norm).__name__.startswith("Gemma") and type(norm).__name__.endswith("RMSNorm")


def _sigma(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The scale a norm divides by on its clean input x.  # [..., 1]"""
    if _gemma(norm):
        return torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.eps)
    return torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + getattr(norm, "eps", 1e-5))


def by_hand(model, batch, task, weight, dim, head, head_dim, later, norms) -> torch.Tensor:
    """Per-example loss with the head removed on its direct path only.  # [N]"""
    out, sigma = {}, {}
    keep = [m.register_forward_hook(lambda m, _a, o: out.__setitem__(m, o)) for m in later]
    keep += [n.register_forward_pre_hook(lambda n, a: sigma.__setitem__(n, _sigma(n, a[0]))) for n in norms]
    try:
        losses(model, batch, task)  # the clean pass: later sublayers' outputs, each norm's sigma
    finally:
        for h in keep:
            h.remove()
    held = [m.register_forward_hook(lambda m, _a, _o: out[m]) for m in later]
    held += [n.register_forward_hook(lambda n, a, _o: frozen(n, sigma[n], a[0])) for n in norms]
    try:
        return with_head_weights_zeroed(weight, dim, head, head_dim, lambda: losses(model, batch, task))
    finally:
        for h in held:
            h.remove()


def check_against_hand(model, batch, task, parts, sites=None):
    """ablate_heads' direct effects of every head (one batch) against by_hand; the result."""
    before = snapshot(model)
    result = ablate_heads(model, [batch], task=task, sites=sites, progress=False, attention=False)
    assert_untouched(model, before)
    assert result.direct["measured"], result.direct
    assert result.direct["path"].startswith("traced"), result.direct
    clean, size = losses(model, batch, task).double(), size_of(model) if sites is None else dict(zip(("depth", "width"), model_size(sites)))
    moved = 0
    for h in result.heads:
        weight, later, norms = parts(model, h.layer)
        D = weight.shape[1] // result.model["n_heads"]
        expected = by_hand(model, batch, task, weight, 1, h.head, D, later, norms).double()
        want = float((expected - clean).sum()) / result.n_units
        assert h.direct_delta_loss == pytest.approx(want, abs=loss_tol(*expected.tolist(), *clean.tolist(), **size)), \
            (h.layer, h.head)
        moved += abs(want) > 100 * loss_tol(1.0, **size)
    assert moved >= 1  # not vacuous: a head moves the loss on its direct path (the takeover: its writer only)
    return result


def _nano():
    torch.manual_seed(0)
    model = nanogpt(False).eval()
    with torch.no_grad():
        for p in model.parameters():  # large enough weights that every head's direct path visibly matters
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def _post():
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=3, max_len=6, n_layers=2, n_heads=2,
                                   d_model=16, norm="post", positions="learned", init_std=0.4)).eval()


def _nano_parts(m, l):
    blocks = m.h
    later = [b.attn for j, b in enumerate(blocks) if j > l] + [b.mlp for j, b in enumerate(blocks) if j >= l]
    norms = [n for b in blocks for n in (b.ln_1, b.ln_2)] + [m.ln_f]
    return blocks[l].attn.c_proj.weight, later, norms


def _zoo_parts(m, l):
    blocks = m.blocks
    later = [b.attn for j, b in enumerate(blocks) if j > l] + [b.mlp for j, b in enumerate(blocks) if j >= l]
    return blocks[l].attn.proj.weight, later, [n for b in blocks for n in (b.ln1, b.ln2)]


def _ids(n: int, t: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(1))  # [N, T]


def _takeover_batch():
    data = takeover_data()
    return {k: v for k, v in data.items() if k != "labels"}, data["labels"]


CASES = {  # name -> (build, batch (inputs, labels), task, parts(model, layer) -> (out-proj weight [d, H * D], later, norms))
    "nanogpt": (_nano, lambda: (_ids(10, 8, 40), None), "lm", _nano_parts),
    "takeover": (planted_takeover, _takeover_batch, "classification", _nano_parts),
    "zoo-post-norm": (_post, lambda: (_ids(12, 6, 10), torch.arange(12) % 3), "classification", _zoo_parts),
}


@pytest.mark.parametrize("case", list(CASES))
def test_traced_direct_effect_equals_the_hand_computation(case):
    build, make_batch, task, parts = CASES[case]
    check_against_hand(build(), make_batch(), task, parts)


def test_traced_equals_declared_on_the_reference_transformer():
    """The same heads through the generic adapter (so the path is traced) and through the reference adapter
    (its declared final norm): two mechanisms, one direct effect per head."""
    from diagnose.adapters._generic import named_sites

    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="lm", vocab_size=20, max_len=8, n_layers=2, n_heads=2, d_model=16,
                                    init_std=0.3)).eval()
    ids = _ids(8, 8, 20)
    declared = ablate_heads(model, {"input_ids": ids}, task="lm", batch_size=4, progress=False, attention=False)
    traced = ablate_heads(model, {"input_ids": ids}, task="lm", batch_size=4, progress=False, attention=False,
                          sites=named_sites(model, "blocks.*.attn", None, ids[:1]))
    assert declared.direct["path"].startswith("declared") and traced.direct["path"].startswith("traced")
    tol = loss_tol(declared.baseline["loss"], **size_of(model))
    assert [h.direct_delta_loss for h in traced.heads] == pytest.approx(
        [h.direct_delta_loss for h in declared.heads], abs=tol)
    assert any(abs(h.direct_delta_loss) > 100 * tol for h in declared.heads)


def test_gemma2_whose_norm_sits_on_the_write_before_the_add():
    """Gemma 2 norms each sublayer's output before the residual add (post_attention_layernorm on the head's
    write): no declared path, the traced one freezes that norm too."""
    pytest.importorskip("transformers")
    from diagnose.zoo.families import build

    model = build("Gemma2", "eager", vocab_size=40, initializer_range=0.2)

    def parts(m, l):
        layers = m.model.layers
        later = [b.self_attn for j, b in enumerate(layers) if j > l] + [b.mlp for j, b in enumerate(layers) if j >= l]
        norms = [n for b in layers for n in (b.input_layernorm, b.post_attention_layernorm,
                                             b.pre_feedforward_layernorm, b.post_feedforward_layernorm)]
        return layers[l].self_attn.o_proj.weight, later, norms + [m.model.norm]
    check_against_hand(model, (_ids(6, 8, 40), None), "lm", parts)


def test_a_sublayer_that_adds_the_residual_inside_is_refused_in_one_line():
    """Bloom's attention and MLP return the stream itself (they add the residual inside): clamped, they would
    undo every head, which the check on the first example finds."""
    pytest.importorskip("transformers")
    from diagnose.zoo.families import build

    model = build("Bloom", "eager", vocab_size=40, initializer_range=0.2)
    result = ablate_heads(model, [(_ids(4, 8, 40), None)], task="lm", progress=False, attention=False)
    reason = result.direct["reason"]
    assert result.direct["measured"] is False and "\n" not in reason, result.direct
    assert "carries the residual stream itself" in reason and "residual_path" in reason
    assert all(h.direct_delta_loss is None for h in result.heads)


def test_planted_takeover_writer_is_compensated_not_inert():
    """The layer-0 writer: its total effect hidden by the layer-1 backup, its direct effect the whole margin."""
    result = ablate_heads(planted_takeover(), takeover_data(), task="classification", batch_size=16, progress=False)
    writer, backup = result.head(0, 0), result.head(1, 0)
    band = result.significance["negligible_band"]["loss"]
    assert max(map(abs, writer.delta_loss_ci)) < band
    assert writer.direct_delta_loss > 0.5 * math.log(2) and writer.direct_delta_loss_ci[0] > band
    assert writer.compensated is True and backup.compensated is False
    kinds = {(f["layer"], f["head"]): f["kind"] for f in result.flags}
    assert kinds[(0, 0)] == "striking_but_compensated"
    assert kinds[(1, 0)] == "striking_but_inert"  # it changes nothing, directly or not
    reason = next(f["reason"] for f in result.flags if f["kind"] == "striking_but_compensated")
    assert "self-repair" in reason and f"{writer.direct_delta_loss:+.4f}" in reason


def test_an_unknown_norm_says_which_and_how_and_the_flag_says_may_be_compensated():
    model, data = with_unknown_norm(), takeover_data()
    result = ablate_heads(model, data, task="classification", batch_size=16, progress=False)
    reason = result.direct["reason"]
    assert result.direct["measured"] is False and "\n" not in reason
    assert "ln_f (OddRMSNorm)" in reason and "register_norm(OddRMSNorm" in reason
    assert all(h.compensated is None and h.direct_delta_loss is None for h in result.heads)
    flag = next(f for f in result.flags if (f["layer"], f["head"]) == (0, 0))
    assert flag["kind"] == "striking_but_inert"
    assert "may make up for it (self-repair)" in flag["reason"] and "ablate_together" in flag["reason"]
    diagnose.register_norm(OddRMSNorm, diagnose.NormForm("RMSNorm, gain alpha", centred=False, weight="alpha"))
    try:
        measured = ablate_heads(model, data, task="classification", batch_size=16, progress=False)
    finally:
        diagnose.unregister_norm(OddRMSNorm)
    assert measured.direct["measured"], measured.direct
    assert measured.head(0, 0).compensated is True
    kinds = {(f["layer"], f["head"]): f["kind"] for f in measured.flags}
    assert kinds[(0, 0)] == "striking_but_compensated"
