"""A family: one adapter file under diagnose/adapters/ and its line in _registry.py's built-in list. Two
recipes: a post-norm family with a norm of its own, measured by the direct effects (which needs the norms'
frozen forms the adapters declare, diagnose/adapters/norms.py, built on branch `family` for issue 30), and a
family with interleaved fused qkv, cut by prune from its declared ProjectionLayout (which every tree has).

The family's own model code (a model library's, or the user's) sits in the test, as it would sit outside
this package; the adapter knows it by its classes' names, as the Hugging Face adapters do."""

from __future__ import annotations

from . import Recipe, insert, new, replace

REGISTRY = "diagnose/adapters/_registry.py"
BUILTIN_LIST = "    return [ReferenceAdapter(), "


def registered(module: str, name: str) -> tuple:
    """Its import in builtin_adapters() and its place, first, in the list tried."""
    return (insert(REGISTRY, f"    from .{module} import {name}", after="    from ._hf_bert import BertAdapter"),
            replace(REGISTRY, BUILTIN_LIST, f"    return [{name}(), ReferenceAdapter(), "))


# ---- a post-norm family with a new norm ---------------------------------------------------------------

POST_NORM_ADAPTER = '''
"""The ScaledRMS family: the reference Transformer's blocks, post-norm, with norms of its own (`ScaledRMS`:
x / rms(x) * g, its gain kept as `g`). Declared here: the norms' frozen form and a head's residual path,
so direct effects are measured by declaration."""

from __future__ import annotations

import torch.nn as nn

from ._reference import ReferenceAdapter
from .base import AttentionSite
from .norms import NormForm
from .readout import ResidualPath

SCALED_RMS = NormForm("ScaledRMS", centred=False, weight="g")


def _ours(module: nn.Module) -> bool:
    return type(module).__name__ == "ScaledRMS"


class ScaledRMSAdapter(ReferenceAdapter):
    family = "scaled-rms"

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        return super().find(model) if any(_ours(m) for m in model.modules()) else None

    def norm_form(self, norm: nn.Module) -> NormForm | None:
        return SCALED_RMS if _ours(norm) else None

    def residual_path(self, model: nn.Module, site: AttentionSite) -> ResidualPath:
        """Post-norm: a head's write crosses its block's two norms and every later block's."""
        at = next(i for i, b in enumerate(model.blocks) if b.attn is site.module)
        return ResidualPath(tuple(n for b in model.blocks[at:] for n in (b.ln1, b.ln2)), model.blocks[-1])
'''

POST_NORM_TEST = '''
"""The built-in scaled-rms family (a post-norm family with a norm of its own): found by its adapter with no
registration, its direct effects measured on the declared path and equal to a hand computation with every
later sublayer at its clean output and every ScaledRMS at its clean scale."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from diagnose.ablation import ablate_heads
from diagnose.sites import find_heads
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import loss_tol, size_of
from .helpers import with_head_weights_zeroed
from .test_direct_traced import losses

pytestmark = pytest.mark.numerics  # ablates, floats compared: every kernel path

D = 16


class ScaledRMS(nn.Module):
    """The family's norm: x / rms(x) * g."""

    def __init__(self, d: int):
        super().__init__()
        self.g = nn.Parameter(torch.randn(d, generator=torch.Generator().manual_seed(d)) * 0.3 + 1.0)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.g


def _model() -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=3, max_len=6, n_layers=2, n_heads=2,
                                    d_model=D, norm="post", init_std=0.4))
    for block in model.blocks:
        block.ln1, block.ln2 = ScaledRMS(D), ScaledRMS(D)
    return model.eval()


def _by_hand(model, batch, layer, head) -> torch.Tensor:
    """Per-example loss with the head removed, later sublayers at their clean outputs, each norm at its
    clean rms.  # [N]"""
    later = [b.attn for j, b in enumerate(model.blocks) if j > layer] + [b.mlp for j, b in enumerate(model.blocks)
                                                                         if j >= layer]
    norms = [n for b in model.blocks for n in (b.ln1, b.ln2)]
    out, rms = {}, {}
    regs = [m.register_forward_hook(lambda m, _a, o: out.__setitem__(m, o)) for m in later]
    regs += [n.register_forward_pre_hook(lambda n, a: rms.__setitem__(
        n, torch.sqrt(a[0].pow(2).mean(-1, keepdim=True) + 1e-5))) for n in norms]
    try:
        losses(model, batch, "classification")
    finally:
        for r in regs:
            r.remove()
    regs = [m.register_forward_hook(lambda m, _a, _o: out[m]) for m in later]
    regs += [n.register_forward_hook(lambda n, a, _o: a[0] / rms[n] * n.g) for n in norms]
    try:
        return with_head_weights_zeroed(model.blocks[layer].attn.proj.weight, 1, head, D // 2,
                                        lambda: losses(model, batch, "classification"))
    finally:
        for r in regs:
            r.remove()


def test_its_direct_effects_are_measured_by_declaration_and_equal_the_hand_computation():
    model = _model()
    assert [s.adapter.family for s in find_heads(model)] == ["scaled-rms"] * 2
    batch = (torch.randint(1, 10, (12, 6), generator=torch.Generator().manual_seed(1)), torch.arange(12) % 3)
    result = ablate_heads(model, [batch], task="classification", progress=False, attention=False)
    assert result.model["family"] == "scaled-rms"
    assert result.direct["measured"] and result.direct["path"].startswith("declared"), result.direct
    clean, size = losses(model, batch, "classification").double(), size_of(model)
    for h in result.heads:
        expected = _by_hand(model, batch, h.layer, h.head).double()
        want = float((expected - clean).sum()) / result.n_units
        assert h.direct_delta_loss == pytest.approx(want, abs=loss_tol(*expected.tolist(), *clean.tolist(), **size))
    assert any(abs(h.direct_delta_loss) > 100 * loss_tol(1.0, **size) for h in result.heads)
'''

POST_NORM = Recipe(
    "post-norm", "a post-norm family with a new norm, with direct effects", ("norm form", "model-family adapter"),
    (new("diagnose/adapters/_scaled_rms.py", POST_NORM_ADAPTER), *registered("_scaled_rms", "ScaledRMSAdapter"),
     new("tests/ablation/test_scaled_rms.py", POST_NORM_TEST),
     insert("docs/families.md", "The scaled-rms family (`diagnose/adapters/_scaled_rms.py`): post-norm blocks with "
            "`ScaledRMS` norms (x / rms(x) * g), declared by its adapter (`norm_form`, `residual_path`), so "
            "`diagnose heads` measures its direct effects.\n")),
    "tests/ablation/test_scaled_rms.py", guards=("tests/ablation/test_norm_forms.py",),
    needs=("diagnose/adapters/norms.py", "diagnose/adapters/readout.py"),
    note="3 for a user's own family (its adapter passed to `register_adapter`, no `_registry.py`).")

# ---- a family with interleaved fused qkv, for prune ----------------------------------------------------

LAYOUT_ADAPTER = '''
"""The interleaved-qkv family: one fused qkv Linear grouped per head ([q_h k_h v_h]), found by the generic
tracer; prune cuts it from the layout declared here."""

from __future__ import annotations

import torch.nn as nn

from ._generic import GenericAdapter
from .base import AttentionSite
from .layout import INTERLEAVED, Projection, ProjectionLayout


class InterleavedQKVAdapter(GenericAdapter):
    family = "interleaved-qkv"
    layout = ProjectionLayout(inputs=(Projection("qkv", INTERLEAVED),), heads=("n_heads",))

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        ours = any(type(m).__name__ == "InterleavedAttention" for m in model.modules())
        return super().find(model) if ours else None
'''

LAYOUT_TEST = '''
"""The built-in interleaved-qkv family: found with no registration and cut by prune from its declared
layout, the pruned model equal to the original with the removed heads' weights zeroed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.sites import find_heads

from .helpers import assert_close, outputs, zeroed

pytestmark = pytest.mark.numerics  # prunes, floats compared: every kernel path


class InterleavedAttention(nn.Module):
    """The family's attention: qkv(x) viewed [B, T, H, 3, D]."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, T, C]
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, self.n_heads, 3, self.head_dim).unbind(3)  # each [B, T, H, D]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        probs = (q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)).softmax(-1)  # [B, H, T, T]
        return self.out((probs @ v).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class Net(nn.Module):
    def __init__(self, vocab=20, d_model=16, n_heads=4, n_layers=2, n_classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(InterleavedAttention(d_model, n_heads) for _ in range(n_layers))
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, input_ids):
        x = self.emb(input_ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x.mean(1))


def test_it_is_found_and_cut_from_its_declared_layout():
    torch.manual_seed(0)
    model = Net().eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 20, (16, 6), generator=torch.Generator().manual_seed(1))
    data = {"input_ids": ids, "labels": outputs(model, {"input_ids": ids}).argmax(-1)}
    sites = find_heads(model)
    assert [s.adapter.family for s in sites] == ["interleaved-qkv"] * 2
    result = diagnose.prune_heads(model, data, max_drop=100.0, limit=5)
    assert len(result.order) == 5 and result.verify.passed and result.info.family == "interleaved-qkv"
    inputs = {"input_ids": ids}
    assert_close(outputs(result.model, inputs), outputs(zeroed(model, sites, result.removed), inputs), sites)
    for layer, left in zip(result.model.layers, result.heads_left):
        assert layer.n_heads == left and layer.qkv.out_features == 3 * 4 * left and layer.out.in_features == 4 * left
'''

LAYOUT = Recipe(
    "layout", "a family with interleaved fused qkv, for prune", ("projection layout", "model-family adapter"),
    (new("diagnose/adapters/_interleaved_qkv.py", LAYOUT_ADAPTER), *registered("_interleaved_qkv",
                                                                              "InterleavedQKVAdapter"),
     new("tests/prune/test_interleaved_qkv.py", LAYOUT_TEST),
     insert("docs/prune.md", "| interleaved qkv (`diagnose/adapters/_interleaved_qkv.py`) | fused `qkv` rows "
            "grouped per head ([q_h k_h v_h]), `out` columns | allowed, if the module's forward handles it |",
            after="| nanoGPT-style (found by the generic tracer)")),
    "tests/prune/test_interleaved_qkv.py", guards=("tests/prune/test_layout.py",),
    note="3 for a user's own family (its adapter passed to `register_adapter`, no `_registry.py`).")

RECIPES = [POST_NORM, LAYOUT]
