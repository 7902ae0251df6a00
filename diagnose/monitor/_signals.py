"""What the monitor measures, reduced on the device so that a logged step costs one host sync.

Three watchers, each owning its hooks and removing them in `remove()`:
  ActivationWatch  forward hooks on the residual blocks -> hidden_stats [S] per forward
  AttentionWatch   the adapters' watch_pattern, entered only on sampled steps -> entropy, max weight
  GradNorms        per-parameter gradient norms read at step(), grouped into blocks on the host
"""

from __future__ import annotations

import warnings
from contextlib import ExitStack
from typing import Any, Callable

import torch
import torch.nn as nn

from .._activations import hidden_finish, hidden_partial
from ._layout import ATTENTION_ROWS, pool, to_pooled


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DistributedDataParallel / DataParallel and torch.compile's
    OptimizedModule (`_orig_mod`), in any nesting, so that names are the eager model's."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile(model)
            model = model._orig_mod
        else:
            return model


def is_compiled(model: nn.Module) -> bool:
    """Whether `model` is torch.compile's wrapper (or holds one inside DDP / DataParallel)."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while isinstance(model, wrappers):
        model = model.module
    return isinstance(getattr(model, "_orig_mod", None), nn.Module)


def at_end_of_backward(fn) -> None:
    """From inside a backward pass (a tensor hook), run fn() once the pass is over and after every
    callback queued during it: DDP queues its gradient averaging there, so fn sees the final
    gradients. (Queued from a queued callback: the engine runs callbacks added while it runs them.)"""
    engine = torch.autograd.Variable._execution_engine
    engine.queue_callback(lambda: engine.queue_callback(fn))


def find_sites(model: nn.Module, example: Any = None) -> list:
    """Attention sites through the capture machinery, traced on `example` where the generic tracer is
    needed; [] when none, after one warning that says why and what is lost."""
    from ..errors import NoAttentionFoundError
    from ..sites import find_heads

    try:
        return list(find_heads(model, example=example))
    except NoAttentionFoundError as exc:
        warnings.warn(f"diagnose: TrainingMonitor records no attention statistics (per-head entropy, max weight, "
                      f"max logit) for {type(model).__name__}: {exc}", RuntimeWarning, stacklevel=4)
        return []


def find_blocks(model: nn.Module, sites: list) -> list[tuple[str, nn.Module]]:
    """(name, module) of each residual block: from the family adapter, else the longest
    ModuleList/Sequential of identical modules (the shape every Transformer stack has)."""
    if sites:
        blocks = sites[0].adapter.blocks(model)
        if blocks:
            return list(blocks)
    best: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            kids = list(mod.named_children())
            if len(kids) > len(best) and len({type(m) for _, m in kids}) == 1:
                best = [(f"{name}.{k}" if name else k, m) for k, m in kids]
    if not best:
        warnings.warn(f"diagnose: TrainingMonitor records no activation statistics (act_*, token_cos, rank_collapse, "
                      f"activation_growth) for {type(model).__name__}: no attention was found to place the residual "
                      "blocks around and no ModuleList/Sequential of identical blocks exists; fix: pass example=inputs, "
                      "or register an adapter whose blocks(model) names them", RuntimeWarning, stacklevel=4)
    return best


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return getattr(out, "last_hidden_state", None)


class ActivationWatch:
    """Forward hooks reduce each block's output over channels (hidden_partial: [4, B, T] and a [B, C]
    sum) and keep nothing of its size; collect() finishes all blocks' statistics in one batched call.

    Only forwards with autograd enabled count (an evaluation under no_grad between steps is
    not the step being logged). `armed` is cleared on unlogged steps: the hooks then return
    at once. The model's `attention_mask` keyword, when given, keeps padding out of the stats.
    """

    def __init__(self, model: nn.Module, blocks: list[tuple[str, nn.Module]]):
        self.names = [n for n, _ in blocks]
        self.armed = True
        self.mask: torch.Tensor | None = None  # [B, T] of the current forward, 1 real 0 padding
        self._stats: list[list[tuple]] = [[] for _ in blocks]  # per block, per forward: hidden_partial's
        self.forwards = 0  # armed forwards with grad since the last collect (micro-batches), from block 0
        self.traced = False  # set once dynamo (torch.compile) traced these hooks into a graph
        self.ran = False  # set by the first forward through the hooks (compiled or not)
        self.positions = 0  # batch x positions of those forwards (padding included): host ints, no sync
        self._handles = [model.register_forward_pre_hook(self._catch_mask, with_kwargs=True)]
        try:
            self._handles += [m.register_forward_hook(self._hook(i)) for i, (_, m) in enumerate(blocks)]
        except BaseException:
            self.remove()
            raise

    def _catch_mask(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        self.mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def _hook(self, i: int):
        def hook(module, args, out):
            if i == 0:
                self.ran = True
                if torch.compiler.is_compiling():
                    self.traced = True  # a constant in the graph; the attribute is set each time it runs
            if not self.armed or not torch.is_grad_enabled():
                return
            x = _first_tensor(out)
            if x is None or x.dim() != 3 or not x.is_floating_point():
                return
            if i == 0:
                self.forwards += 1
                self.positions += x.shape[0] * x.shape[1]
            mask = self.mask if self.mask is not None and self.mask.shape == x.shape[:2] else None
            self._stats[i].append((*hidden_partial(x, mask), mask))  # rows, unit_sum, weights, the mask they came from
        return hook

    def collect(self) -> tuple[torch.Tensor | None, list[bool]]:
        """Stats [L, S] (STAT_NAMES, the variance as E[x^2]: layout.to_pooled) pooled over this
        step's forwards, and which blocks ran; clears the buffers. The second moment (not the
        variance) is returned so that micro-batches and ranks pool exactly by averaging."""
        present = [bool(s) for s in self._stats]
        self.forwards = self.positions = 0
        if not any(present):
            return None, present
        stats = self._finished()
        if all(len(st) <= 1 for st in stats):  # the usual case: one forward per step
            # float64 before forming E[x^2]: var = E[x^2] - mean^2 must not lose var to rounding
            rows = to_pooled(torch.stack([st[0] for st in stats if st]).double())  # [L_present, S]
        else:  # micro-batches (gradient accumulation): pool them
            rows = torch.stack([pool(to_pooled(torch.stack(st).double())) for st in stats if st])
        self._stats = [[] for _ in self._stats]
        self.mask = None
        return rows, present  # [L_present, S]

    def _finished(self) -> list[list[torch.Tensor]]:
        """Per block, per forward, hidden_stats [S]: one hidden_finish for all blocks of one forward
        when their shapes agree (the usual stack of identical blocks), else one each."""
        out: list[list[torch.Tensor]] = [[] for _ in self._stats]
        n = max(len(st) for st in self._stats)
        for f in range(n):
            parts = [(i, st[f]) for i, st in enumerate(self._stats) if len(st) > f]
            first = parts[0][1]
            # same shapes and the same mask (or none): the same weights, so one batched finish (no sync)
            if all(p[0].shape == first[0].shape and p[1].shape == first[1].shape and p[3] is first[3]
                   for _, p in parts):
                done = hidden_finish(torch.stack([p[0] for _, p in parts]), torch.stack([p[1] for _, p in parts]),
                                     first[2])  # [L, S]
                for (i, _), row in zip(parts, done):
                    out[i].append(row)
            else:
                for i, p in parts:
                    out[i].append(hidden_finish(p[0][None], p[1][None], p[2])[0])
        return out

    def discard(self) -> None:
        """Drop what this step's forwards left (an unlogged step)."""
        if any(self._stats):
            self._stats = [[] for _ in self._stats]
        self.mask = None
        self.forwards = self.positions = 0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class AttentionWatch:
    """Per-head entropy, max weight and uniform entropy of every site, on sampled steps only.

    arm() enters each adapter's watch_pattern (so nothing is hooked on other steps);
    collect() leaves them and returns per site [3, H] pooled over the forwards it saw (the third
    row: the entropy of uniform attention over the visible keys, the same for every head).

    Under torch.compile the hooks must stay: dynamo bakes the hooks a module has when it traces
    into the graph and, by default, does not guard on them (`skip_nnmodule_hook_guards`), so hooks
    added later never run and hooks removed still look present. `hold()` keeps the watch entered
    for good and samples by the `sampling` switch instead, which dynamo does guard on: one graph
    with the statistics and one without, each compiled once, not a recompile per sample.
    """

    def __init__(self, sites: list, activations: ActivationWatch | None = None):
        self.sites = sites
        self._acts = activations
        self._stack: ExitStack | None = None
        self._seen: list[list[torch.Tensor]] = [[] for _ in sites]
        self.sampling = False  # whether the callbacks record (the hooks may stay in place, see hold())
        self.held = False
        # more readers of the same sampled probabilities, reader(site index, probs): another probe
        # shares these hooks, and so their place in a compiled graph, instead of adding its own
        self.readers: list[Callable[[int, Any], None]] = []
        # reader(site index, scores) of the pre-softmax logits of a model's own softmax (base.send_scores):
        # a Tensor [B, H, Tq, Tk] or a LazyProbs; for SDPA the probabilities above hold them
        self.score_readers: list[Callable[[int, Any], None]] = []

    @property
    def armed(self) -> bool:
        return self._stack is not None and self.sampling

    def hold(self) -> None:
        """Keep the hooks in place from now on (a compiled model); sample by the switch."""
        self.held = True

    def arm(self) -> None:
        self.sampling = True
        self.enter()

    def enter(self) -> None:
        """Put the hooks in place (recording only while `sampling`)."""
        if self._stack is not None or not self.sites:
            return
        stack = ExitStack()
        try:
            for i, site in enumerate(self.sites):
                # held (compiled, or not known yet): the adapter's hooks that dynamo traces, where it has them
                watch = getattr(site.adapter, "watch_pattern_traced", None) if self.held else None
                stack.enter_context((watch or site.adapter.watch_pattern)(site, self._callback(i)))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def _callback(self, i: int):
        from ..attention_stats import entropy_and_max, uniform_entropy

        def callback(probs: torch.Tensor) -> None:  # probs [B, H, Tq, Tk]
            if not self.sampling or not torch.is_grad_enabled():
                return
            mask = self._acts.mask if self._acts is not None else None
            if mask is not None and mask.shape != (probs.shape[0], probs.shape[-1]):
                mask = None
            ent, mx = entropy_and_max(probs, key_mask=mask)  # [H], [H]
            uni = uniform_entropy(probs, key_mask=mask).float().expand_as(ent)  # [H]
            rows = {"entropy": ent.float(), "max_weight": mx.float(), "uniform_entropy": uni}
            self._seen[i].append(torch.stack([rows[r] for r in ATTENTION_ROWS]))  # [3, H]
            for read in self.readers:
                read(i, probs)

        def on_scores(scores: Any) -> None:  # [B, H, Tq, Tk] logits of the model's own softmax
            if self.sampling and torch.is_grad_enabled():
                for read in self.score_readers:
                    read(i, scores)

        callback.on_scores = on_scores
        return callback

    def collect(self) -> list[torch.Tensor | None]:
        """Per site [3, H] (entropy, max weight, uniform entropy) averaged over forwards, None if it never ran."""
        self._leave()
        out = [torch.stack(s).mean(0) if s else None for s in self._seen]
        self._seen = [[] for _ in self.sites]
        return out

    def _leave(self) -> None:
        """Stop sampling: leave the watch, or only turn the switch off when the hooks are held."""
        self.sampling = False
        if not self.held:
            self.disarm()

    def disarm(self) -> None:
        """Remove the hooks (also held ones: the monitor closes)."""
        self.sampling = False
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def discard(self) -> None:
        """Leave the watch and drop what it saw (an unlogged step)."""
        self._leave()
        self._seen = [[] for _ in self.sites]


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5 keeps it private
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


class GradNorms:
    """Per-parameter gradient norms on the device, and the block each parameter belongs to.

    Under FSDP2 (`fully_shard`) a gradient is a DTensor sharded across ranks: its local shard's
    norm is taken here, and `sharded` marks it, so that the monitor sums the squares across ranks
    (in one all_reduce for all of them)."""

    def __init__(self, model: nn.Module, block_names: list[str]):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        prefixes = [b + "." for b in block_names]
        # index of the block that owns each parameter, -1 for embeddings, final norm, head
        self.owner = [next((i for i, pre in enumerate(prefixes) if n.startswith(pre)), -1)
                      for n, _ in self.params]
        self.dtensor = _dtensor_type()  # looked up once: norms() runs at every logged step

    def norms(self) -> tuple[torch.Tensor | None, list[int], list[bool]]:
        """(norms [P_with_grad], their indices into self.params, which are local shards); no sync."""
        idx = [i for i, (_, p) in enumerate(self.params) if p.grad is not None and not p.grad.is_sparse]
        if not idx:
            return None, idx, []
        grads = [self.params[i][1].grad for i in idx]
        dtensor = self.dtensor
        sharded = [False] * len(grads)
        if dtensor is not None and any(isinstance(g, dtensor) for g in grads):
            for j, g in enumerate(grads):
                if isinstance(g, dtensor):
                    sharded[j] = any(pl.is_shard() for pl in g.placements)
                    grads[j] = g.to_local()
        dev = grads[0].device
        norms = torch._foreach_norm(grads)  # one kernel per dtype/device group, no sync
        if all(n.device == dev and n.dtype == norms[0].dtype for n in norms):
            return torch.stack(norms).double(), idx, sharded  # [P]
        return torch.stack([n.to(dev, torch.float64) for n in norms]), idx, sharded  # [P]


def scaler_divisor(scaler: Any, optimizer: Any) -> torch.Tensor | None:
    """The factor the grads are still multiplied by under a torch.amp GradScaler (a device
    tensor, no sync), or None when the scaler is off or the user already called unscale_()."""
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return None
    if optimizer is not None:
        state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
        stage = state.get("stage")
        if stage is not None and getattr(stage, "name", "") == "UNSCALED":
            return None
    scale = getattr(scaler, "_scale", None)
    return scale.double() if isinstance(scale, torch.Tensor) else None
