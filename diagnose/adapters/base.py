"""What an adapter declares for one model family, and the AttentionSite it returns.

An adapter knows, for its family only: which modules are attention layers (with head
count and head dim), how to observe each head's attention probabilities, how to reach
each head's output before the output projection, and which modules are the residual
blocks. Family checks live only in adapter files; everything else is generic.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.nn as nn

from ._probs import LazyProbs

# callback(probs), one call per forward of the site, probs [B, H, Tq, Tk] per head: a Tensor (any float dtype)
# or a _probs.LazyProbs (recomputed SDPA rows, made on demand). Consumers read it through
# _probs.query_chunks (bounded memory) or _probs.materialise (the whole map, float32).
# A callback may carry an attribute `on_scores(scores)`: where the model computes its own softmax, an
# adapter that sees its input (the pre-softmax logits, masked entries -inf or very negative) calls it
# first with that Tensor [B, H, Tq, Tk], or with a LazyProbs whose scores() are those logits, so that a
# consumer of a Tensor map can still read the logits (the monitor's max logit). send_scores() below.
PatternCallback = Callable[["torch.Tensor | LazyProbs"], None]
# fn(head_out) -> head_out, both [B, T, H, D]: each head's output before the output projection
HeadOutputFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class AttentionSite:
    """One attention layer: `layer` is its index in forward order, `name` its qualified module name."""

    layer: int
    name: str
    n_heads: int
    head_dim: int
    module: nn.Module = field(repr=False)
    adapter: "Adapter" = field(repr=False)
    n_kv_heads: int | None = None  # grouped-query attention: fewer key/value heads
    # the module whose input is the heads' outputs side by side [B, T, H * D], where the family has one
    out_proj: nn.Module | None = field(default=None, repr=False)
    # (k, n): the k-th of n applications of a module shared across depths (ALBERT); None: applied once
    application: tuple[int, int] | None = None


class Adapter(Protocol):
    """Optional besides these: `layout`, the family's projection layout (layout.py), a
    ProjectionLayout or a method `layout(site)` returning one; prune cuts only families that have it.
    `compile_safe = True` when watch_pattern is a plain module hook that dynamo traces into a graph
    without a break (the monitor then keeps it under torch.compile), or when the adapter has
    `watch_pattern_traced(site, callback)`, the same contract with such hooks, which the monitor
    uses instead while its hooks are held for a compiled model; absent means False. It may also be
    a method `compile_safe(site) -> bool`, for a family whose modules differ (compile_safe() below).
    For direct effects: `final_norm(model)` or `residual_path(model, site)`, the path from a head to the
    output (readout.py; without either the path is traced, _stream.py), and `norm_form(module)`, the
    frozen form of the family's own norm classes (norms.py). For circuits: `mlp(model, site)`, the module of
    the MLP in the site's layer, reading the stream after the site wrote and adding its one output tensor
    (readout.py; without it the circuit's nodes are the heads). `output_layer(model)`: the per-position module
    that makes the logits from the hidden states (Hugging Face: get_output_embeddings), so that a sweep
    makes logits only at the scored positions (ablation/scored.py); absent: every position's are made."""

    family: str

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        """Sites in forward order, or None when the model is not of this family."""

    def watch_pattern(self, site: AttentionSite, callback: PatternCallback) -> AbstractContextManager:
        """While active, call `callback(probs)` on every forward of the site."""

    def intervene(self, site: AttentionSite, fn: HeadOutputFn) -> AbstractContextManager:
        """While active, replace the site's per-head outputs by fn(head_out) before the output projection."""

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """(qualified name, module) of each residual block, whose output is the residual stream."""


def send_scores(callback: PatternCallback, scores: "torch.Tensor | LazyProbs") -> None:
    """Hand the pre-softmax logits of a model's own softmax to the callback's `on_scores`, if it has one."""
    on_scores = getattr(callback, "on_scores", None)
    if on_scores is not None:
        on_scores(scores)


# watch_pattern_traced (hooks that rebuild q and k, or the intercept as `with mode:`) is traced into one
# graph by the dynamo of torch 2.13 and 2.14 (tests/monitor/test_compile.py); torch 2.4's fails on it (an
# internal error on the hooks' closures, a graph per step, a break: measured). Versions between were not
# available to test, so they are treated as 2.4 (attention not sampled under compile, with a warning).
TRACED_HOOKS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


def hand_over(callback: PatternCallback, probs: LazyProbs, eager: bool) -> None:
    """Rebuilt probabilities as the intercept would hand them over: under the eager implementation (the
    model's own softmax) its logits to `on_scores`, then the whole map; under SDPA the rows."""
    if eager:
        send_scores(callback, probs)
        callback(probs.full())  # [B, H, Tq, Tk]
    else:
        callback(probs)


def compile_safe(site: AttentionSite) -> bool:
    """Whether the site's adapter watches its attention with hooks dynamo traces (Adapter's `compile_safe`);
    an adapter that does so through watch_pattern_traced only from torch 2.13 (TRACED_HOOKS)."""
    if hasattr(site.adapter, "watch_pattern_traced") and not TRACED_HOOKS:
        return False
    safe = getattr(site.adapter, "compile_safe", False)
    return bool(safe(site) if callable(safe) else safe)
