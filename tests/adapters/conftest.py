"""Checks every family's adapter must pass: the gate is the identity at fn = identity and
equals zeroing the head's slice of the output-projection weights at fn = zero head h."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

from diagnose.objectives import call_model, logits_of

from ..hooks import hook_snapshot


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
               valid: torch.Tensor | None = None) -> None:
    """Identity gate leaves the output unchanged; zeroing head h equals zeroing its weights.

    valid [B, T] (optional) restricts the comparison to real positions."""
    import diagnose

    sites = diagnose.find_heads(model)
    before = hook_snapshot(model)
    with torch.no_grad():
        base = output_of(model, inputs)
        for site in sites if site_index is None else [sites[site_index]]:
            with site.adapter.intervene(site, lambda x: x):
                same = output_of(model, inputs)
            _close(same, base, valid, 1e-6)
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
                _close(gated, expected, valid, 1e-5)
                assert (gated - base).abs().max() > 1e-6, "zeroing a head changed nothing: the gate missed"
    assert hook_snapshot(model) == before, "a hook was left behind"


def _close(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor | None, tol: float) -> None:
    if valid is not None:
        a, b = a[valid.bool()], b[valid.bool()]
    err = (a - b).abs().max().item()
    assert err <= tol, f"max abs difference {err} > {tol}"


@pytest.fixture
def gate_check():
    return check_gate


@pytest.fixture
def model_output():
    return output_of
