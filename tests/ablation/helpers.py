"""Independent reference computations for the ablation tests (no gate, no engine)."""

from __future__ import annotations

import torch
import torch.nn as nn

from diagnose.objectives import call_model, logits_of, score, targets_for

from .. import tolerance
from ..hooks import hook_snapshot


def evaluate(model: nn.Module, batches, task: str) -> tuple[float, float]:
    """(accuracy, loss) per scored unit over the batches, plain forwards in eval mode."""
    correct = loss = count = 0.0
    with torch.no_grad():
        for inputs, labels in batches:
            s = score(logits_of(call_model(model, inputs)), targets_for(task, inputs, labels))
            correct += float(s.correct.sum())
            loss += float(s.loss_sum.sum())
            count += float(s.count.sum())
    return correct / count, loss / count


def with_head_weights_zeroed(weight: torch.Tensor, dim: int, head: int, head_dim: int, fn):
    """Run fn() with the head's input slice of the output projection zeroed, then restore it."""
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.narrow(dim, head * head_dim, head_dim).zero_()
        return fn()
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def snapshot(model: nn.Module):
    """Hooks, replaced forwards, training flags and a bit-exact copy of the state_dict."""
    return (hook_snapshot(model),
            sorted(n for n, m in model.named_modules() if "forward" in m.__dict__),
            [m.training for m in model.modules()],
            {k: v.detach().clone() for k, v in model.state_dict().items()})


def assert_untouched(model: nn.Module, before) -> None:
    hooks, forwards, modes, state = before
    now = snapshot(model)
    assert now[0] == hooks, "a hook was left behind"
    assert now[1] == forwards, "a replaced forward was left behind"
    assert now[2] == modes, "training flags changed"
    assert now[3].keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(now[3][k], v), f"{k} changed"


def loss_tol(*losses: float, **size) -> float:
    """Absolute tolerance for a difference of float32 losses from a model of `size` (depth, width):
    tests/tolerance.py's, which takes it from the tolerance policy."""
    return tolerance.loss_tol(*losses, **size)
