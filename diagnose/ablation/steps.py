"""The two ways through a sweep, shared by `ablate_heads` and prune: every head exactly, or every head
ranked from the clean passes and only the chosen ones ablated exactly.

Both run this rank's micro-batches through one `Sweep` (its base `closed` heads shut throughout), add
the per-example sums up in an `Accumulator` and hand back the accumulator of all ranks together.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator, Sequence

import torch

from .._distributed import Ranks
from ..objectives import batch_size_of
from .accumulate import Accumulator
from .shards import merge
from .sweep import Clean, Sweep

KEEP_BYTES = 512 * 2 ** 20  # the ranked way keeps clean batches (logits, block outputs) up to this for verification

Tick = Callable[[], None]


def first_example(batches: Sequence[tuple[Any, Any]], r: Ranks) -> int:
    """The data set's index of this rank's first example (the start of its contiguous shard)."""
    pairs = getattr(batches, "pairs", batches)  # Batches: count where the data is, without moving it
    return sum(batch_size_of(inputs) for inputs, _ in pairs[:r.shard(len(pairs)).start])


def every_head(sweep: Sweep, parts: Sequence[tuple[Any, Any]], first: int, r: Ranks,
               tick: Tick | None = None) -> Accumulator:
    """Each part's clean pass (with gradients), then every head ablated in it."""
    return every_head_under(sweep, parts, first, r, [None], tick)[0]


def every_head_under(sweep: Sweep, parts: Sequence[tuple[Any, Any]], first: int, r: Ranks,
                     fills: Sequence[Callable[[Sweep], None] | None], tick: Tick | None = None) -> list[Accumulator]:
    """every_head under several fills (methods) at once: one accumulator per fill. Each part's clean pass
    and its recorded block outputs (the prefixes) are computed once and shared; before each fill's
    ablations `use(sweep)` sets that fill on the gates (None: leave the gates as they are). The clean
    pass's gradients (d loss / d gate = head output - fill) are the first fill's, so only the first
    accumulator gets them; the others have no gradient sums (no grad importance, no --fast ranking)."""
    accs = [Accumulator(len(sweep.heads)) for _ in fills]

    def work() -> None:
        for inputs, labels, rows in indexed(parts, first):
            if fills[0] is not None:
                fills[0](sweep)
            clean = sweep.clean(inputs, labels, grad=True, record=True, rows=rows)
            for i, (use, acc) in enumerate(zip(fills, accs)):
                if use is not None:
                    use(sweep)
                acc.add_clean(clean if i == 0 else replace(clean, grads=None))
                acc.add_ablated(sweep.ablate(clean, range(acc.n_heads), tick))

    r.run_local("ablating heads", work)
    return [merge(acc, r) for acc in accs]


def ranked_heads(sweep: Sweep, parts: Sequence[tuple[Any, Any]], first: int, r: Ranks,
                 choose: Callable[[Accumulator], list[int]], *, record: bool = True,
                 tick: Tick | None = None) -> tuple[Accumulator, list[int]]:
    """Clean passes with gradients, then `choose(all ranks' sums)` picks the heads (global indices) that
    are ablated exactly. record: keep block outputs for prefix replay (off when nothing will be ablated)."""
    acc = Accumulator(len(sweep.heads))
    kept = r.run_local("ranking heads", lambda: _clean_passes(sweep, acc, parts, first, record, tick))
    chosen = [int(m) for m in choose(merge(acc, r))]  # every rank ranks the same sums

    def work() -> None:
        for i, (inputs, labels, rows) in enumerate(indexed(parts, first) if chosen else []):
            clean = kept[i] if kept is not None else sweep.clean(inputs, labels, grad=False, record=True, rows=rows)
            acc.add_ablated(sweep.ablate(clean, chosen), i)
            if tick:
                tick()

    r.run_local("verifying the top heads", work)
    return merge(acc, r), chosen


def _clean_passes(sweep: Sweep, acc: Accumulator, parts: Sequence[tuple[Any, Any]], first: int, record: bool,
                  tick: Tick | None) -> list[Clean] | None:
    """The clean passes, kept while they fit KEEP_BYTES, else None (the verification then recomputes them)."""
    kept: list[Clean] | None = []
    for inputs, labels, rows in indexed(parts, first):
        clean = sweep.clean(inputs, labels, grad=True, record=record, rows=rows)
        acc.add_clean(clean)
        if kept is not None:
            kept.append(clean)
            if sum(c.nbytes() for c in kept) > KEEP_BYTES:
                kept = None
        if tick:
            tick()
    return kept


def indexed(parts: Sequence[tuple[Any, Any]], first: int) -> Iterator[tuple[Any, Any, torch.Tensor]]:
    """(inputs, labels, rows) per part, rows [B] the data set's index of each example (for fills that
    depend on the example; the CPU, where a method's state sits)."""
    start = first
    for inputs, labels in parts:
        B = batch_size_of(inputs)
        yield inputs, labels, torch.arange(start, start + B)
        start += B
