"""Checks every family's adapter must pass: the gate is the identity at fn = identity and
equals zeroing the head's slice of the output-projection weights at fn = zero head h."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

from diagnose.objectives import call_model, logits_of

from ..hooks import hook_snapshot
from ..tolerance import assert_close, assert_exact, differ, size_of


def _weight_of(proj: nn.Module) -> tuple[torch.Tensor, int]:
    """(weight, dim holding the input features): Linear [out, in] -> 1; HF Conv1D [in, out] -> 0."""
    inner = getattr(proj, "original_component", None) or getattr(proj, "_original_component", None)
    if isinstance(inner, nn.Module):  # TransformerLens LinearBridge wraps the real layer
        proj = inner
    if isinstance(proj, nn.Linear):
        return proj.weight, 1
    assert hasattr(proj, "nf"), f"unknown projection {type(proj).__name__}"
    return proj.weight, 0


def output_of(model: nn.Module, inputs: Any) -> torch.Tensor:
    out = call_model(model, inputs)
    if hasattr(out, "last_hidden_state") and not hasattr(out, "logits"):
        return out.last_hidden_state
    return logits_of(out)


def zero_head(h: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(heads: torch.Tensor) -> torch.Tensor:  # [B, T, H, D]
        out = heads.clone()
        out[:, :, h] = 0
        return out
    return fn


def check_gate(model: nn.Module, inputs: Any, *, site_index: int | None = None, heads: tuple[int, ...] = (0, -1),
               valid: torch.Tensor | None = None, recomputed: bool = False) -> None:
    """Identity gate leaves the output unchanged; zeroing head h equals zeroing its weights.

    valid [B, T] (optional) restricts the comparison to real positions. The identity gate is
    bit-equal to no gate, unless `recomputed`: the adapter's gate recomputes the heads and the
    output projection itself (torch MHA, whose module call is one fused function), which is other
    float32 sums, judged by the policy."""
    import diagnose

    sites = diagnose.find_heads(model)
    size = size_of(model)  # the gated forward and the zeroed-weight one: float32, the model's depth and width
    before = hook_snapshot(model)
    with torch.no_grad():
        base = output_of(model, inputs)
        for site in sites if site_index is None else [sites[site_index]]:
            with site.adapter.intervene(site, lambda x: x):
                same = output_of(model, inputs)
            if recomputed:
                assert_close(*_valid(same, base, valid), **size)
            else:
                assert_exact(*_valid(same, base, valid))  # an identity gate passes the heads through unchanged
            for h in heads:
                h = h % site.n_heads
                with site.adapter.intervene(site, zero_head(h)):
                    gated = output_of(model, inputs)
                w, dim = _weight_of(site.out_proj)
                saved = w.clone()
                try:
                    w.narrow(dim, h * site.head_dim, site.head_dim).zero_()
                    expected = output_of(model, inputs)
                finally:
                    w.copy_(saved)
                assert_close(*_valid(gated, expected, valid), **size)
                assert differ(*_valid(gated, base, valid), **size), "zeroing a head changed nothing: the gate missed"
    assert hook_snapshot(model) == before, "a hook was left behind"


def _valid(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b at the valid [B, T] positions only (all when valid is None)."""
    if valid is not None:
        a, b = a[valid.bool()], b[valid.bool()]
    return a, b


@pytest.fixture
def gate_check():
    return check_gate


@pytest.fixture
def model_output():
    return output_of
