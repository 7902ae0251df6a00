"""One slicer from each family's declared projection layout: the row indices of each kind worked
out by hand, and a family prune has never seen (interleaved fused qkv, [q_h k_h v_h] per head)
cut by declaring its layout in a registered adapter, nothing else."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.adapters import INTERLEAVED, Projection, ProjectionLayout, register_adapter, unregister_adapter
from diagnose.adapters._generic import GenericAdapter
from diagnose.errors import ConfigError
from diagnose.prune._slice import _rows
from diagnose.sites import find_heads

from .helpers import assert_close, outputs, zeroed

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("kind, rows", [
    ("separate", [2, 3]),  # head 1 of 2, D = 2: features 2..3
    ("blocked", [2, 3, 6, 7, 10, 11]),  # [q; k; v], each 2 * 2 wide: head 1 in each block
    ("interleaved", [6, 7, 8, 9, 10, 11]),  # [q0 k0 v0 q1 k1 v1], each 2 wide: head 1's group
])
def test_each_kind_keeps_the_head_s_rows(kind, rows):
    assert _rows(kind, [1], n_heads=2, head_dim=2).tolist() == rows


def test_a_layout_names_only_known_kinds_and_kv_heads_sit_apart():
    with pytest.raises(ConfigError, match="not one of"):
        Projection("qkv", "diagonal")
    with pytest.raises(ConfigError, match="grouped-query"):
        Projection("qkv", INTERLEAVED, kv=True)


class InterleavedAttention(nn.Module):
    """Fused qkv grouped per head: qkv(x) viewed [B, T, H, 3, D] ([q_h k_h v_h] per head)."""

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


class InterleavedAdapter(GenericAdapter):
    """The whole of what a new family needs for prune: its layout, declared once."""

    family = "toy-interleaved"
    layout = ProjectionLayout(inputs=(Projection("qkv", INTERLEAVED),), heads=("n_heads",))


def test_a_new_family_with_interleaved_qkv_is_cut_from_its_declared_layout():
    torch.manual_seed(0)
    model = Net().eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 20, (16, 6), generator=torch.Generator().manual_seed(1))
    data = {"input_ids": ids, "labels": outputs(model, {"input_ids": ids}).argmax(-1)}
    adapter = register_adapter(InterleavedAdapter())
    try:
        sites = find_heads(model)
        assert [s.adapter.family for s in sites] == ["toy-interleaved"] * 2
        result = diagnose.prune_heads(model, data, max_drop=100.0, limit=5)
    finally:
        unregister_adapter(adapter)
    assert len(result.order) == 5 and result.verify.passed and result.info.family == "toy-interleaved"
    inputs = {"input_ids": ids}
    assert_close(outputs(result.model, inputs), outputs(zeroed(model, sites, result.removed), inputs), sites)
    for layer, left in zip(result.model.layers, result.heads_left):
        assert layer.n_heads == left and layer.qkv.out_features == 3 * 4 * left and layer.out.in_features == 4 * left


def test_an_adapter_without_a_layout_is_refused_in_one_line():
    class NoLayout(GenericAdapter):
        family = "toy-unlaid"
        layout = None

    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(1))
    adapter = register_adapter(NoLayout())
    try:
        with pytest.raises(ConfigError) as exc:
            diagnose.prune_heads(model, {"input_ids": ids, "labels": torch.zeros(8, dtype=torch.long)})
    finally:
        unregister_adapter(adapter)
    assert "'toy-unlaid' family cannot be cut" in str(exc.value) and "\n" not in str(exc.value)
