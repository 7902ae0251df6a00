"""A small, honest trainer for the reference model: Adam (beta2 = 0.98), linear warmup then
linear decay, gradient clipping at 1.0 -- the recipe of the original Transformer, minus the
inverse-sqrt schedule. Each switch can be turned off to show what it protects against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..objectives import logits_of, score
from .tasks import TaskData


@dataclass
class TrainConfig:
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50  # 0: no warmup (full lr from step 0)
    min_lr_ratio: float = 0.1  # linear decay to lr * min_lr_ratio at the last step
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    clip: float | None = 1.0  # None: no gradient clipping
    seed: int = 0


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    eval_loss: float = float("nan")
    eval_accuracy: float = float("nan")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the base lr at `step`: linear warmup, then linear decay."""
    if cfg.warmup and step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    done = min(1.0, (step - cfg.warmup) / span)
    return 1.0 - (1.0 - cfg.min_lr_ratio) * done


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig):
    """Adam(W) with the warmup/decay schedule, as (optimizer, scheduler)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    return opt, sched


def batch_inputs(data: TaskData, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": data.input_ids[idx], "attention_mask": data.attention_mask[idx]}


def train(
    model: torch.nn.Module,
    data: TaskData,
    cfg: TrainConfig | None = None,
    *,
    on_backward: Callable[[int, torch.Tensor, torch.optim.Optimizer], Any] | None = None,
    eval_data: TaskData | None = None,
) -> TrainResult:
    """Train on random mini-batches of `data` for cfg.steps steps.

    on_backward(step, loss, optimizer) runs after backward() and before clipping and
    optimizer.step() -- where diagnose.TrainingMonitor.step belongs.
    """
    cfg = cfg or TrainConfig()
    g = torch.Generator().manual_seed(cfg.seed)
    opt, sched = make_optimizer(model, cfg)
    result = TrainResult()
    model.train()
    start = time.perf_counter()
    for step in range(cfg.steps):
        idx = torch.randint(0, len(data), (cfg.batch_size,), generator=g)
        logits = logits_of(model(**batch_inputs(data, idx)))
        loss = score(logits, data.labels[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if on_backward is not None:
            on_backward(step, loss, opt)
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        result.losses.append(float(loss.detach()))
    result.seconds = time.perf_counter() - start
    model.eval()
    if eval_data is not None:
        result.eval_loss, result.eval_accuracy = evaluate(model, eval_data)
    return result


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TaskData, batch_size: int = 512) -> tuple[float, float]:
    """(mean loss per scored unit, accuracy) over the whole data set, in eval mode."""
    was_training = model.training
    model.eval()
    loss_sum = correct = count = 0.0
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(data)))
        s = score(logits_of(model(**batch_inputs(data, idx))), data.labels[idx])
        loss_sum += float(s.loss_sum.sum())
        correct += float(s.correct.sum())
        count += float(s.count.sum())
    model.train(was_training)
    return loss_sum / max(count, 1.0), correct / max(count, 1.0)
