"""Norms' frozen forms (adapters/norms.py): each form reproduces the norm it declares, norms of code
nobody declared are recognised by behaviour, and a post-norm family with a norm of its own is added by
its adapter alone (norm_form and residual_path), its direct effects equal to a hand computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.adapters import LAYER_NORM, RMS_NORM, NormForm
from diagnose.adapters._reference import ReferenceAdapter
from diagnose.adapters.norms import ONE_PLUS_RMS_NORM, infer, looks_like_norm
from diagnose.adapters.readout import ResidualPath
from diagnose.ablation import ablate_heads
from diagnose.zoo import ModelConfig, Transformer

from ..clients.nanogpt import LayerNorm as NanoLayerNorm
from ..tolerance import assert_close, loss_tol, size_of
from .helpers import with_head_weights_zeroed
from .test_direct_traced import losses

pytestmark = pytest.mark.numerics

D = 16


def _x() -> torch.Tensor:
    return torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0)) * 0.1 + 0.3  # [B, T, d]


def _gained(norm: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return norm


@pytest.mark.parametrize("norm, form", [(nn.LayerNorm(D), LAYER_NORM), (nn.RMSNorm(D), RMS_NORM),
                                        (nn.RMSNorm(D, eps=1e-3), RMS_NORM), (NanoLayerNorm(D, True), LAYER_NORM)])
def test_each_form_reproduces_its_norm_and_is_recognised_by_behaviour(norm, form):
    norm, x = _gained(norm), _x()
    with torch.no_grad():
        y = norm(x)
    assert_close(form.output(norm, x), y, depth=1, width=D)
    assert looks_like_norm(norm, x, y) and infer(norm, x, y) == form
    delta = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    bias = 0.0 if getattr(norm, "bias", None) is None else norm.bias
    # the frozen change is the norm of (x + delta) with x's scale, minus the norm of x
    spread = x.var(-1, unbiased=False, keepdim=True) if form.centred else x.pow(2).mean(-1, keepdim=True)
    eps = torch.finfo(x.dtype).eps if getattr(norm, "eps", 1e-5) is None else getattr(norm, "eps", 1e-5)
    moved = x + delta
    moved = moved - moved.mean(-1, keepdim=True) if form.centred else moved
    with torch.no_grad():
        want = moved / torch.sqrt(spread + eps) * norm.weight + bias - y
        assert_close(form.change(norm, x, delta), want, depth=1, width=D)


def test_gemma_rmsnorm_is_declared_with_its_one_plus_weight():
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    from diagnose.adapters._hf_llama import LlamaAdapter

    norm, x = _gained(GemmaRMSNorm(D, eps=1e-6)), _x()
    form = LlamaAdapter().norm_form(norm)
    assert form.gain_offset == 1.0 and infer(norm, x, norm(x)) == ONE_PLUS_RMS_NORM
    with torch.no_grad():
        assert_close(form.output(norm, x), norm(x), depth=1, width=D)


@pytest.mark.parametrize("module", [nn.Linear(D, D), nn.GELU(), nn.Identity(), nn.Dropout(0.1)])
def test_modules_that_do_not_normalise_are_not_norms(module):
    x = _x()
    with torch.no_grad():
        assert not looks_like_norm(module.eval(), x, module(x))


class PostNorm(nn.Module):
    """A family's own LayerNorm, keeping its gain and bias as `g` and `b`."""

    def __init__(self, d: int):
        super().__init__()
        self.g, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5) * self.g \
            + self.b


POST_NORM = NormForm("PostNorm", centred=True, weight="g")


class ToyPostNormAdapter(ReferenceAdapter):
    """What a post-norm family with a new norm declares, in its adapter file alone."""

    family = "toy-post-norm"

    def norm_form(self, norm: nn.Module) -> NormForm | None:
        return POST_NORM if isinstance(norm, PostNorm) else None

    def residual_path(self, model: nn.Module, site) -> ResidualPath:
        at = next(i for i, b in enumerate(model.blocks) if b.attn is site.module)
        return ResidualPath(tuple(n for b in model.blocks[at:] for n in (b.ln1, b.ln2)), model.blocks[-1])


def _toy() -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=3, max_len=6, n_layers=2, n_heads=2,
                                    d_model=D, norm="post", init_std=0.4))
    for block in model.blocks:
        block.ln1, block.ln2 = _gained(PostNorm(D)), _gained(PostNorm(D))
    return model.eval()


def _by_hand(model, batch, layer, head) -> torch.Tensor:
    """Per-example loss, head removed, later sublayers at their clean outputs, every PostNorm with its clean
    sigma.  # [N]"""
    later = [b.attn for j, b in enumerate(model.blocks) if j > layer] + [b.mlp for j, b in enumerate(model.blocks)
                                                                         if j >= layer]
    norms = [n for b in model.blocks for n in (b.ln1, b.ln2)]
    out, sigma = {}, {}
    regs = [m.register_forward_hook(lambda m, _a, o: out.__setitem__(m, o)) for m in later]
    regs += [n.register_forward_pre_hook(lambda n, a: sigma.__setitem__(
        n, torch.sqrt(a[0].var(-1, unbiased=False, keepdim=True) + 1e-5))) for n in norms]
    try:
        losses(model, batch, "classification")
    finally:
        for r in regs:
            r.remove()
    regs = [m.register_forward_hook(lambda m, _a, _o: out[m]) for m in later]
    regs += [n.register_forward_hook(lambda n, a, _o: (a[0] - a[0].mean(-1, keepdim=True)) / sigma[n] * n.g + n.b)
             for n in norms]
    try:
        weight = model.blocks[layer].attn.proj.weight  # [d, H * D]
        return with_head_weights_zeroed(weight, 1, head, D // 2, lambda: losses(model, batch, "classification"))
    finally:
        for r in regs:
            r.remove()


def test_a_post_norm_family_with_its_own_norm_is_declared_by_its_adapter_alone():
    model = _toy()
    batch = (torch.randint(1, 10, (12, 6), generator=torch.Generator().manual_seed(1)), torch.arange(12) % 3)
    adapter = diagnose.register_adapter(ToyPostNormAdapter())
    try:
        result = ablate_heads(model, [batch], task="classification", progress=False, attention=False)
    finally:
        diagnose.adapters.unregister_adapter(adapter)
    assert result.model["family"] == "toy-post-norm"
    assert result.direct["measured"] and result.direct["path"].startswith("declared"), result.direct
    clean, size = losses(model, batch, "classification").double(), size_of(model)
    for h in result.heads:
        expected = _by_hand(model, batch, h.layer, h.head).double()
        want = float((expected - clean).sum()) / result.n_units
        assert h.direct_delta_loss == pytest.approx(want, abs=loss_tol(*expected.tolist(), *clean.tolist(), **size))
    assert any(abs(h.direct_delta_loss) > 100 * loss_tol(1.0, **size) for h in result.heads)
