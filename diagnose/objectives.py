"""Loss and correctness per example, shared by the trainer and the analyses.

Conventions (DESIGN.md): task "classification" scores logits [B, C] against labels [B], or
[B, T, C] against [B, T] with -100 ignored. Task "lm" scores logits [B, T, V]; its labels,
when given, are aligned with the logits (labels[:, t] is the token to predict at t) and,
when absent, are the inputs shifted by one, with padding ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from .errors import ConfigError, DataError, NonFiniteError

IGNORE = -100
TASKS = ("classification", "lm")


def default_task(model: torch.nn.Module, data: Any) -> str:
    """The task to score with when the user does not say: the checkpoint's meta["task"] if saved;
    else labels [N] -> classification; labels [N, T] or none -> lm."""
    meta = getattr(model, "diagnose_meta", None)
    if isinstance(meta, dict) and meta.get("task") in TASKS:
        return meta["task"]
    labels = getattr(data, "labels", None)
    if labels is None and isinstance(data, dict):
        labels = data.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() == 1:
        return "classification"
    return "lm"


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """Run the model on a batch as diagnose.calling.call does: a Tensor positionally, a Mapping as
    keyword arguments where forward names them, else its main input to forward's first parameter."""
    from .calling import call

    return call(model, inputs)


def batch_size_of(inputs: Any) -> int:
    """B of a batch as call_model passes it: the first dim of the Tensor, or of input_ids (else
    the first tensor with a batch dim) in a Mapping. Anything else raises DataError: a guessed
    count would be a made-up number of examples."""
    if isinstance(inputs, torch.Tensor) and inputs.dim() > 0:
        return int(inputs.shape[0])
    if isinstance(inputs, Mapping):
        t = inputs.get("input_ids")
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            t = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        if t is not None:
            return int(t.shape[0])
    raise DataError(f"cannot tell the batch size of inputs of type {type(inputs).__name__}; pass a "
                    "Tensor [B, ...] or a Mapping of them (e.g. input_ids, attention_mask)")


def logits_of(output: Any) -> torch.Tensor:
    """A model's output: a Tensor, a tuple/list (first element), or an object with .logits."""
    from .calling import logits

    return logits(output)


def require_finite(model: torch.nn.Module, logits: torch.Tensor, where: str) -> None:
    """Raise NonFiniteError, naming the likely cause, when `logits` hold NaN or inf.

    Every number computed from such outputs (a loss, an accuracy, a p-value, a leak) is
    meaningless, so the analyses stop instead of reporting them. The cause named is the first
    parameter or buffer with non-finite values, if any (NaN weights), else the forward itself.
    """
    if not logits.is_floating_point() or bool(torch.isfinite(logits).all()):
        return
    bad = [n for n, t in (*model.named_parameters(), *model.named_buffers())
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        cause = (f"{len(bad)} weight tensor(s) hold NaN/inf (first: {bad[0]}); reload or retrain the model "
                 "(a diverged run saves NaN weights)")
    else:
        cause = "the weights are finite, so the forward overflows (check the dtype, masks filled with -inf in " \
                "every key of a row, or inputs out of range)"
    n = int((~torch.isfinite(logits)).sum())
    raise NonFiniteError(f"{type(model).__name__} gives non-finite outputs ({n} of {logits.numel()} values NaN/inf "
                         f"{where}): {cause}")


def targets_for(task: str, inputs: Any, labels: torch.Tensor | None) -> torch.Tensor:
    """Targets aligned with the logits: [B] or [B, T], IGNORE where nothing is predicted."""
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if labels is not None:
        return labels
    if task != "lm":
        raise DataError("classification needs labels")
    ids = inputs["input_ids"] if isinstance(inputs, Mapping) else inputs
    targets = torch.full_like(ids, IGNORE)
    targets[:, :-1] = ids[:, 1:]
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if mask is not None:
        targets[:, :-1][mask[:, 1:] == 0] = IGNORE  # the next token is padding
        targets[mask == 0] = IGNORE
    return targets


@dataclass
class Scores:
    """Per-example sums: loss_sum [B], correct [B], count [B] (number of scored units); with wrong answers
    named, diff_sum [B] (logit of the label minus logit of the wrong answer, summed) over diff_count [B] units."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor
    diff_sum: torch.Tensor | None = None
    diff_count: torch.Tensor | None = None

    @property
    def loss(self) -> torch.Tensor:
        return self.loss_sum.sum() / self.count.sum().clamp_min(1)

    @property
    def accuracy(self) -> torch.Tensor:
        return self.correct.sum() / self.count.sum().clamp_min(1)


def score(logits: torch.Tensor, targets: torch.Tensor, wrong: torch.Tensor | None = None) -> Scores:
    """Cross-entropy and argmax correctness, summed per example (token tasks sum over T). wrong: the wrong
    answer per unit, shaped like targets (IGNORE where none is named): the logit difference label - wrong
    (Wang et al. 2022's metric for IOI), summed over the units that have both."""
    if logits.dim() == targets.dim() + 1 and logits.shape[:-1] == targets.shape:
        flat_logits = logits.reshape(-1, logits.shape[-1]).float()
        flat_t = targets.reshape(-1)
    else:
        raise DataError(f"logits {tuple(logits.shape)} do not match labels {tuple(targets.shape)}")
    valid = flat_t != IGNORE
    if bool(((flat_t < 0) & valid).any()) or bool((flat_t[valid] >= logits.shape[-1]).any()):
        raise DataError(f"labels must lie in [0, {logits.shape[-1]}) or be {IGNORE}")
    safe = flat_t.clamp_min(0)
    loss = F.cross_entropy(flat_logits, safe, reduction="none") * valid
    correct = (flat_logits.argmax(-1) == safe) & valid
    B = targets.shape[0]
    out = Scores(loss.view(B, -1).sum(1), correct.view(B, -1).sum(1).float(), valid.view(B, -1).sum(1).float())
    if wrong is not None:
        out.diff_sum, out.diff_count = logit_diff(flat_logits, safe, valid, wrong.reshape(-1).to(safe.device), B)
    return out


def logit_diff(flat_logits: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor, flat_wrong: torch.Tensor,
               B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: the sum of logit[label] - logit[wrong] over units with both, and their number.  -> [B], [B]"""
    both = valid & (flat_wrong != IGNORE)
    if bool(((flat_wrong < 0) & both).any()) or bool((flat_wrong[both] >= flat_logits.shape[-1]).any()):
        raise DataError(f"wrong_labels must lie in [0, {flat_logits.shape[-1]}) or be {IGNORE}")
    pick = lambda t: flat_logits.gather(1, t.clamp_min(0)[:, None])[:, 0]  # noqa: E731
    diff = (pick(safe) - pick(flat_wrong)) * both
    return diff.view(B, -1).sum(1), both.view(B, -1).sum(1).float()
