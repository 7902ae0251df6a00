"""Direct effects through each family's adapter equal a hand computation without gates: the site's
output with the head's output-projection slice zeroed gives the head's change to the stream; the final
norm's output is replaced by the norm of (clean stream + that change) with the clean stream's scale."""

from __future__ import annotations

import pytest
import torch

from diagnose.ablation import ablate_heads
from diagnose.adapters._hooks import first_tensor

from .helpers import evaluate, loss_tol, with_head_weights_zeroed
from diagnose.zoo.families import FAMILIES as TABLE, module_at

from .test_families import FAMILIES, N
from ..tolerance import size_of

pytestmark = pytest.mark.numerics

# family -> its name in the family table (diagnose/zoo/families.py: output projection and final norm paths)
SITES = {"gpt2-eager": "GPT-2", "gpt2-sdpa": "GPT-2", "llama-eager": "Llama", "llama-sdpa": "Llama",
         "gemma-eager": "Gemma"}


def _site_and_norm(family: str):
    """(site module of layer l, final norm): the output projection's parent and the table's final norm."""
    if family == "reference":
        return lambda m, l: m.blocks[l].attn, lambda m: m.ln_f
    fam = TABLE[SITES[family]]
    return (lambda m, l: module_at(m, fam.out_proj.rsplit(".", 1)[0], l)), (lambda m: module_at(m, fam.final_norm))


def _frozen(norm, x: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """norm(moved) with x's scale: LayerNorm by its formula, LLaMA's and Gemma's RMSNorms by their own."""
    if isinstance(norm, torch.nn.LayerNorm):
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return (moved - moved.mean(-1, keepdim=True)) / sigma * norm.weight + norm.bias
    if type(norm).__name__ == "GemmaRMSNorm":  # x / rms(x) * (1 + weight), in float
        rms = torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.eps)
        return (moved.float() / rms * (1.0 + norm.weight.float())).to(moved.dtype)
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


@pytest.mark.parametrize("family", ["reference", *SITES])
def test_direct_equals_hand_computation(family, tmp_path_factory):
    build, make_data, task, weight_of, head_dim = FAMILIES[family]
    model, data = build(tmp_path_factory), make_data()
    batches = [({k: v[i:i + 5] for k, v in data.items() if k != "labels"},
                data["labels"][i:i + 5] if "labels" in data else None) for i in range(0, N, 5)]
    result = ablate_heads(model, data, task=task, batch_size=5, progress=False, attention=False)
    assert result.direct["measured"] and result.direct["path"].startswith("declared"), result.direct
    _, base = evaluate(model, batches, task)
    site_of, norm_of = _site_and_norm(family)
    size = size_of(model)
    for h in result.heads:
        weight, dim = weight_of(model, h.layer)
        loss = _by_hand(model, batches, task, site_of(model, h.layer), norm_of(model), weight, dim, h.head, head_dim)
        assert h.direct_delta_loss == pytest.approx(loss - base, abs=loss_tol(loss, base, **size)), (h.layer, h.head)

