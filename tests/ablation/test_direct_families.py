"""Direct effects through each family's adapter equal a hand computation without gates: the site's
output with the head's output-projection slice zeroed gives the head's change to the stream; the final
norm's output is replaced by the norm of (clean stream + that change) with the clean stream's scale."""

from __future__ import annotations

import pytest
import torch

from diagnose.ablation import ablate_heads
from diagnose.adapters._hooks import first_tensor

from .helpers import evaluate, loss_tol, with_head_weights_zeroed
from .test_families import FAMILIES, N
from ..tolerance import size_of

pytestmark = pytest.mark.numerics

SITES = {  # family -> (site module of layer l, final norm)
    "reference": (lambda m, l: m.blocks[l].attn, lambda m: m.ln_f),
    "gpt2-eager": (lambda m, l: m.transformer.h[l].attn, lambda m: m.transformer.ln_f),
    "gpt2-sdpa": (lambda m, l: m.transformer.h[l].attn, lambda m: m.transformer.ln_f),
    "llama-eager": (lambda m, l: m.model.layers[l].self_attn, lambda m: m.model.norm),
    "llama-sdpa": (lambda m, l: m.model.layers[l].self_attn, lambda m: m.model.norm),
}


def _frozen(norm, x: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """norm(moved) with x's scale: LayerNorm by its formula, LLaMA's RMSNorm by its own."""
    if isinstance(norm, torch.nn.LayerNorm):
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return (moved - moved.mean(-1, keepdim=True)) / sigma * norm.weight + norm.bias
    rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * (moved / rms)


def _by_hand(model, batches, task, site, norm, weight, dim, head, head_dim) -> float:
    """The loss with the head removed on its direct path only, over `batches`."""
    grab: list[torch.Tensor] = []
    handle = site.register_forward_hook(lambda _m, _a, out: grab.append(first_tensor(out).detach()))
    try:
        evaluate(model, batches, task)
        clean = list(grab)
        grab.clear()
        with_head_weights_zeroed(weight, dim, head, head_dim, lambda: evaluate(model, batches, task))
        changes = [z - c for z, c in zip(grab, clean)]  # per batch [B, T, d]
    finally:
        handle.remove()
    moved = norm.register_forward_hook(lambda _m, args, _out: _frozen(norm, args[0], args[0] + changes.pop(0)))
    try:
        return evaluate(model, batches, task)[1]
    finally:
        moved.remove()


@pytest.mark.parametrize("family", list(SITES))
def test_direct_equals_hand_computation(family, tmp_path_factory):
    build, make_data, task, weight_of, head_dim = FAMILIES[family]
    model, data = build(tmp_path_factory), make_data()
    batches = [({k: v[i:i + 5] for k, v in data.items() if k != "labels"},
                data["labels"][i:i + 5] if "labels" in data else None) for i in range(0, N, 5)]
    result = ablate_heads(model, data, task=task, batch_size=5, progress=False, attention=False)
    assert result.direct["measured"], result.direct
    _, base = evaluate(model, batches, task)
    site_of, norm_of = SITES[family]
    size = size_of(model)
    for h in result.heads:
        weight, dim = weight_of(model, h.layer)
        loss = _by_hand(model, batches, task, site_of(model, h.layer), norm_of(model), weight, dim, h.head, head_dim)
        assert h.direct_delta_loss == pytest.approx(loss - base, abs=loss_tol(loss, base, **size)), (h.layer, h.head)

