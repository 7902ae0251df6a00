"""What each head's heatmap suggests: the capture engine's statistics, plus a few examples'
maps (real tokens only, rounded to 4 decimals) for the report to draw beside the effects."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .._distributed import Ranks, pick
from ..adapters.base import AttentionSite
from ..attention_stats import attention_summary
from .batches import padding_mask
from .shards import merge_stats


def summarise(model: torch.nn.Module, sites: Sequence[AttentionSite], batches: Sequence[tuple[Any, Any]],
              keep: int, tokens: Sequence[Sequence[str]] | None = None, ranks: Ranks = Ranks()) -> dict[str, Any]:
    """{"stats": per site {statistic: [per head]}, "examples": [{index, tokens, attention}]}.

    With several ranks each summarises its shard of the batches; the statistics are merged and the
    kept examples (the first ones: rank 0's) are the same on every rank.
    """
    if not ranks.active:
        summary = attention_summary(model, batches, keep=keep, sites=list(sites))
        return {"stats": summary.stats, "examples": _examples(summary.examples, batches, keep, tokens)}
    mine = pick(batches, ranks)

    def work():
        if not len(mine):
            return None, []
        summary = attention_summary(model, mine, keep=keep if ranks.main else 0, sites=list(sites))
        examples = _examples(summary.examples, mine, keep, tokens) if ranks.main else []
        return summary.totals, examples

    share, examples = ranks.run_local("summarising attention", work)
    parts = ranks.gather((share, examples))
    return {"stats": merge_stats([p[0] for p in parts]), "examples": parts[0][1]}


def _examples(maps: list[torch.Tensor], batches: Sequence[tuple[Any, Any]], keep: int,
              tokens: Sequence[Sequence[str]] | None) -> list[dict[str, Any]]:
    """One entry per kept example: its real tokens and, per layer, [H, T, T] maps over them."""
    ids, masks = [], []
    for inputs, _ in batches:
        x = inputs["input_ids"] if isinstance(inputs, dict) and "input_ids" in inputs else inputs
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return []  # inputs that are not token ids: nothing to label the maps with
        mask = padding_mask(inputs)
        for b in range(x.shape[0]):
            ids.append(x[b])
            masks.append(None if mask is None else mask[b])
            if len(ids) >= keep:
                break
        if len(ids) >= keep:
            break
    out = []
    for i, row in enumerate(ids):
        if any(m.dim() != 4 or m.shape[0] <= i for m in maps):
            break
        real = torch.arange(row.shape[0]) if masks[i] is None else masks[i].nonzero().flatten().cpu()
        if any(m.shape[-1] != row.shape[0] or m.shape[-2] != row.shape[0] for m in maps):
            W = min(min(m.shape[-2:]) for m in maps)  # maps windowed to the first W positions, or over other keys
            real = real[real < W] if W < row.shape[0] else torch.arange(W)
        words = list(tokens[i]) if tokens is not None and i < len(tokens) else [str(int(t)) for t in row]
        out.append({
            "index": i,
            "tokens": [words[j] for j in real.tolist()] if len(words) == row.shape[0] else words,
            "attention": [m[i][:, real][:, :, real].mul(1e4).round().div(1e4).tolist() for m in maps],  # [H, T, T]
        })
    return out
