"""The layout of a logged step's flat vector: what stands where, named once.

A logged step brings everything to the host in ONE `.tolist()`, so its parts travel packed in
one float64 vector: the loss, then per block that ran the activation statistics (one number
per name in `activations.STAT_NAMES`), then per sampled attention site its `ATTENTION_ROWS`
(H numbers each), then the per-parameter gradient norms. `StepLayout` is built from the parts'
shapes and is the only code that knows the offsets: it packs, reduces across ranks and unpacks,
so that adding a statistic changes one tuple and nothing reads a shifted number.

Activation statistics travel with the variance replaced by the second moment E[x^2], so that
forwards (micro-batches) and ranks pool exactly by averaging; `max_abs` pools by the maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._activations import STAT_NAMES

ATTENTION_ROWS = ("entropy", "max_weight", "uniform_entropy")  # AttentionWatch's [3, H] rows
_PER_SITE = ("uniform_entropy",)  # rows that hold one number repeated over heads
_MAX_POOLED = ("max_abs",)  # statistics pooled by the maximum (the others by the mean)
_RECORD_KEY = {"token_cos": "token_cos"}  # step-record key of a statistic, default act_<name>


def record_key(stat: str) -> str:
    """The key of an activation statistic in a step record's layers entry (`var` -> `act_var`)."""
    return _RECORD_KEY.get(stat, f"act_{stat}")


def to_pooled(stats: torch.Tensor, names: tuple[str, ...] = STAT_NAMES) -> torch.Tensor:
    """[..., S] statistics (float64) with the variance replaced by the second moment."""
    mean, var = names.index("mean"), names.index("var")
    out = stats.clone()
    out[..., var] = stats[..., var] + stats[..., mean] ** 2
    return out


def pool(rows: torch.Tensor, names: tuple[str, ...] = STAT_NAMES) -> torch.Tensor:
    """[n, S] pooled rows (to_pooled's form) of n equal-size forwards or ranks -> [S]: the mean,
    the maximum for the max-pooled statistics."""
    out = rows.mean(0)
    for j, name in enumerate(names):
        if name in _MAX_POOLED:
            out[j] = rows[:, j].amax()
    return out


@dataclass(frozen=True)
class StepLayout:
    """Offsets of one logged step's vector. blocks: how many blocks ran (each `len(stats)`
    numbers); heads: the head count of each sampled site, in site order; norms: how many
    gradient norms follow the parts reduced across ranks."""

    blocks: int
    heads: tuple[int, ...]
    norms: int
    stats: tuple[str, ...] = STAT_NAMES

    @classmethod
    def of(cls, acts: torch.Tensor | None, attn: list, norms: torch.Tensor | None,
           stats: tuple[str, ...] = STAT_NAMES) -> "StepLayout":
        """The layout of these parts: acts [L, S] or None, attn per site [3, H] or None, norms [P] or None."""
        if acts is not None and tuple(acts.shape[1:]) != (len(stats),):
            raise ValueError(f"activation statistics {tuple(acts.shape)} do not match {stats}")
        for a in attn:
            if a is not None and a.shape[0] != len(ATTENTION_ROWS):
                raise ValueError(f"attention statistics {tuple(a.shape)} do not match {ATTENTION_ROWS}")
        return cls(0 if acts is None else acts.shape[0], tuple(a.shape[-1] for a in attn if a is not None),
                   0 if norms is None else norms.numel(), tuple(stats))

    @property
    def shared(self) -> int:
        """Length of the part reduced across ranks: loss, activations, attention."""
        return 1 + self.blocks * len(self.stats) + sum(len(ATTENTION_ROWS) * h for h in self.heads)

    def pack_shared(self, loss: torch.Tensor, acts: torch.Tensor | None, attn: list) -> torch.Tensor:
        """One float64 vector of loss [1], acts [L, S] and the sampled sites' [3, H], on loss's device."""
        dev = loss.device
        parts = [loss.to(torch.float64).reshape(1)]
        if acts is not None:
            parts.append(acts.to(dev, torch.float64).flatten())
        parts += [a.to(dev, torch.float64).flatten() for a in attn if a is not None]
        v = torch.cat(parts)
        assert v.numel() == self.shared, (v.numel(), self)
        return v

    def reduce_ranks(self, gathered: torch.Tensor) -> torch.Tensor:
        """[world, shared] of every rank -> [shared]: the mean, the maximum for max-pooled statistics."""
        out = gathered.mean(0)
        cols = [j for j, name in enumerate(self.stats) if name in _MAX_POOLED]
        if self.blocks and cols:
            idx = torch.tensor([1 + len(self.stats) * i + j for i in range(self.blocks) for j in cols],
                               device=gathered.device)
            out[idx] = gathered[:, idx].amax(0)
        return out

    def unpack(self, values: list[Any]) -> tuple[Any, list[dict], list[dict], list[float]]:
        """(loss, per block that ran {record key: value}, per sampled site {row: [H] or a number},
        gradient norms) from the host list; the variance is recovered from the second moment."""
        width = len(self.stats)
        blocks = []
        for i in range(self.blocks):
            row = dict(zip(self.stats, values[1 + width * i:1 + width * (i + 1)]))
            var = row["var"] - row["mean"] * row["mean"]
            row["var"] = max(var, 0.0) if math.isfinite(var) else var
            blocks.append({record_key(k): v for k, v in row.items()})
        pos = 1 + width * self.blocks
        sites = []
        for h in self.heads:
            site = {}
            for k, name in enumerate(ATTENTION_ROWS):
                part = values[pos + k * h:pos + (k + 1) * h]
                site[name] = part[0] if name in _PER_SITE else part
            sites.append(site)
            pos += len(ATTENTION_ROWS) * h
        return values[0], blocks, sites, values[pos:pos + self.norms]
