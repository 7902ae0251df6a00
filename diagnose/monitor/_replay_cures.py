"""The replayed step and its cures: the default loss, a clamp of attention logits (what qk-norm bounds),
and each cure applied to the same restored model and optimizer state.

A cure is one function that, given the step's context, changes how the update is made (or makes none);
every cure is judged the same way: the loss after the update on the same batch and on the held-out
batch (the previous logged step's), against the loss before it.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import UsageError

SDPA = F.scaled_dot_product_attention
_SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax}
KEPT = 0.05  # a cure keeps the loss down when the held-out loss after the update rises by at most 5 %


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if getattr(out, "logits", None) is not None:
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise UsageError(f"the model returned {type(out).__name__}, not logits: pass loss_fn(model, batch) -> "
                     f"per-example loss [B]")


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Per-example cross-entropy [B] for the two batch shapes a loop hands step(batch=): a tuple (x, y)
    (y the targets of model(x), already aligned: [B, T] for [B, T, V] logits or [B] for [B, C]), or a
    dict with `labels` given to the model with the rest (Hugging Face: a causal LM's labels are shifted
    by one here, as its own loss does). Anything else: UsageError asking for loss_fn."""
    shift = False
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        logits = _logits(model(x))
    elif isinstance(batch, dict) and "labels" in batch:
        y = batch["labels"]
        logits = _logits(model(**{k: v for k, v in batch.items() if k != "labels"}))
        shift = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    else:
        raise UsageError("the saved batch is neither (inputs, targets) nor a dict with `labels`: pass "
                         "loss_fn(model, batch) -> per-example loss [B] (the CLI: --loss module:function)")
    if shift:
        logits, y = logits[:, :-1], y[:, 1:]
    if logits.dim() == 3 and y.dim() == 2:
        per = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none", ignore_index=-100)
        mask = (y != -100).float()  # [B, T]
        return (per.view_as(mask) * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B]
    if logits.dim() == 2 and y.dim() == 1:
        return F.cross_entropy(logits.float(), y, reduction="none")  # [B]
    raise UsageError(f"logits {list(logits.shape)} and targets {list(y.shape)} are not [B, T, V] / [B, T] nor "
                     f"[B, C] / [B]: pass loss_fn(model, batch) -> per-example loss [B]")


class ClampLogits(TorchFunctionMode):
    """Every attention softmax (a 4-D softmax over its last dim) and SDPA call computed with its
    pre-softmax logits clamped at `cap`, the bound qk-layernorm puts on them; masked entries stay masked."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = float(cap)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return self._sdpa(*args, **kwargs)
        if func in _SOFTMAX and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim in (-1, 3):
                return func(args[0].clamp(max=self.cap), *args[1:], **kwargs)
        return func(*args, **kwargs)

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)  # [B, H, Tq, Tk]
        s = s.clamp(max=self.cap)
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return F.dropout(s.softmax(-1), dropout_p) @ v  # [B, H, Tq, D]


@dataclass
class StepContext:
    """What every cure starts from: the model and optimizer as saved, the batch, the loss function."""

    model: torch.nn.Module
    optimizer: Any
    batch: Any
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    clip: float | None  # the run's own clip norm (run.json), applied as the run did
    seed: int = 0

    def __post_init__(self) -> None:
        self.model_state = copy.deepcopy(self.model.state_dict())
        self.opt_state = copy.deepcopy(self.optimizer.state_dict())

    def restore(self) -> None:
        """The saved state back, and no gradient left (a caller's backward must not add to ours)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.load_state_dict(self.model_state)
        self.optimizer.load_state_dict(copy.deepcopy(self.opt_state))

    def backward(self, mode: Any = None) -> torch.Tensor:
        """The step's forward and backward in train mode (dropout seeded alike for every cure); per-example loss [B]."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(self.seed)
        with mode or nullcontext():
            per = self.loss_fn(self.model, self.batch)
            per.float().mean().backward()
        return per.detach()

    @torch.no_grad()
    def loss_on(self, batch: Any) -> float | None:
        if batch is None:
            return None
        self.model.eval()
        return float(self.loss_fn(self.model, batch).float().mean())


def _clip(ctx: StepContext, norm: float | None) -> None:
    if norm is not None:
        torch.nn.utils.clip_grad_norm_([p for p in ctx.model.parameters() if p.grad is not None], norm)


def _with_groups(ctx: StepContext, key: str, scale: float) -> None:
    for g in ctx.optimizer.param_groups:
        g[key] = g[key] * scale


def cures(history_grad: float | None, cap: float | None, adam: bool) -> list[tuple[str, str, Callable | None]]:
    """(name, what it does, fn(ctx) making the update) for every cure; fn None: not tried, the reason in `what`."""
    def update(pre: Callable[[StepContext], Any] = lambda c: None, mode: Callable[[], Any] = lambda: None):
        def run(ctx: StepContext) -> None:
            ctx.backward(mode())
            _clip(ctx, ctx.clip)
            pre(ctx)
            ctx.optimizer.step()
        return run

    out = [("none", "the update as the run made it (a no-op cure)", update()),
           ("skip", "skip the batch: no update", lambda ctx: None),
           ("lr/10", "the lr 10x lower for this step", update(lambda c: _with_groups(c, "lr", 0.1)))]
    if history_grad is not None:
        out.append(("clip", f"clip the gradient norm at {history_grad:.3g}, the run's median before the spike",
                    update(lambda c: _clip(c, history_grad))))
    else:
        out.append(("clip", "not tried: the run recorded no gradient norm before the spike", None))
    if cap is not None:
        out.append(("clamp logits", f"attention logits clamped at {cap:.3g}, the largest the run recorded before "
                                    "(the bound qk-norm keeps)", update(mode=lambda: ClampLogits(cap))))
    else:
        out.append(("clamp logits", "not tried: the run recorded no attention max logit before the spike", None))
    for name, scale in (("eps/1000", 1e-3), ("eps x1000", 1e3)):
        out.append((name, f"Adam's eps {scale:g}x", update(lambda c, s=scale: _with_groups(c, "eps", s)))
                   if adam else (name, "not tried: the optimizer has no eps", None))
    return out


def try_cures(ctx: StepContext, holdout: Any, history_grad: float | None,
              cap: float | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each cure on the restored state: the loss after its update on the same batch and on `holdout`, and
    whether it kept the held-out loss (the same batch's when there is none) within KEPT of before.
    Returns ({same, holdout}: the losses before the update, the rows)."""
    ctx.restore()
    before_same, before_held = ctx.loss_on(ctx.batch), ctx.loss_on(holdout)
    adam = all("eps" in g for g in ctx.optimizer.param_groups)
    rows = []
    for name, what, fn in cures(history_grad, cap, adam):
        row: dict[str, Any] = {"cure": name, "what": what, "tried": fn is not None, "loss_same": None,
                               "loss_holdout": None, "kept_down": None}
        if fn is not None:
            ctx.restore()
            fn(ctx)
            row["loss_same"], row["loss_holdout"] = ctx.loss_on(ctx.batch), ctx.loss_on(holdout)
            after, base = ((row["loss_holdout"], before_held) if before_held is not None
                           else (row["loss_same"], before_same))
            row["kept_down"] = bool(after == after and after <= base + KEPT * abs(base))
        rows.append(row)
    ctx.restore()
    return {"same": before_same, "holdout": before_held}, rows
