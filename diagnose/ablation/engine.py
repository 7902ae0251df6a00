"""ablate_heads: remove each attention head in turn and measure what the model loses.

One clean pass per batch through the head gates gives the baseline, d loss / d gate
(gradient importance) and the block outputs for prefix reuse; the ablations follow,
several heads per forward. Mean ablation first averages each head's output over all
real tokens of the data set (examples and positions pooled, the usual choice: a
per-position mean would leak position information a head did not carry). `fast=True`
ranks every head by a cheap estimate from that one clean pass (FAST_RANK: the change of the
loss to second order, the curvature from the same per-example gradients; it tracked the
exact effect best on real and demo models, see bench/bench_estimators.py) and ablates only
the top ones exactly.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from .._distributed import Ranks, pick, ranks
from ..adapters.base import AttentionSite
from ..adapters.shared import shared_modules
from ..errors import ConfigError
from ..modes import eval_mode
from ..objectives import TASKS
from ..sites import find_heads
from . import contrast, roles, significance
from .accumulate import Accumulator, head_effects
from .attention import summarise
from .batches import Batches, as_batches
from .plan import Plan, micro_batches, plan_sweep
from .gate import METHODS, gated
from .result import HeadEffect, HeadsResult
from .shards import merge
from .sweep import Sweep
from .together import ablate_together

DEFAULT_TOP = 5
FAST_RANK = "second_order_delta_loss"  # the cheap estimate closest to exact ablation (bench/bench_estimators.py)
RANKINGS = ("second_order_delta_loss", "estimated_delta_loss", "grad_importance_raw")
MIN_EFFECT = 0.05  # negligible: |delta loss| under 5 % of the baseline loss (contrast.default_band)
KEEP_BYTES = 512 * 2 ** 20  # --fast keeps clean batches (logits, block outputs) up to this for verification


def ablate_heads(model: torch.nn.Module, data: Any, *, task: str = "classification", method: str = "zero",
                 batch_size: int | None = None, progress: bool | Callable[[int, int], None] = True,
                 fast: bool = False, top: int | None = None, alpha: float = 0.05, n_boot: int = 2000,
                 seed: int = 0, attention: bool = True, keep: int = 3, sites: Sequence[AttentionSite] | None = None,
                 reuse: bool = True, tokens: Sequence[Sequence[str]] | None = None, correction: str = "holm",
                 min_effect: float = MIN_EFFECT, rank_by: str = FAST_RANK,
                 together: Sequence[Sequence[tuple[int, int]]] = (), distributed: bool | None = None,
                 max_memory: int | str | None = None) -> HeadsResult:
    """Ablate every head (or, with fast=True, the `top` heads by the rank_by estimate) and test each effect.

    data: a DataSet / TaskData / dict with input_ids (cut into batch_size batches) or an iterable of
    (inputs, labels) pairs. progress: True for a bar on stderr, or a callable(done, total).
    attention: also summarise each head's attention (keeping `keep` examples' maps for the report).
    reuse: replay the unchanged blocks below each ablated layer (off only to measure its worth).
    tokens: token strings per example for the kept maps (default: data.tokens, else the ids).
    correction: "holm" (default) or "bh" across the heads tested. min_effect: the negligible band for
    `striking_but_inert`, as a fraction of the baseline loss. rank_by: the --fast estimate.
    together: groups of (layer, head) to also close at once (`result.together`); closed first, so a
    head that does not exist fails before the sweep.
    distributed: None (default) shards the batches over the ranks of an initialised torch.distributed
    group (torchrun), True requires one, False runs alone. Each rank sweeps a contiguous shard; the
    per-example outcomes are gathered, so every rank returns the result one process would (write it
    from rank 0 only). Call it on every rank with the same model, data and settings.
    max_memory: a cap on one step's estimated memory (bytes, or a size such as "2GB"); the sweep's
    micro-batch and heads per forward are chosen to fit it and the free memory (plan.py), and reported
    in `result.timing`.
    """
    opts = _Options(task=task, method=method, batch_size=batch_size, fast=fast, top=top, alpha=alpha,
                    n_boot=n_boot, seed=seed, attention=attention, keep=keep, reuse=reuse,
                    correction=correction, min_effect=min_effect, rank_by=rank_by)
    opts.check()
    r = ranks(distributed)
    run = _Run(model=model, started=time.perf_counter(), ranks=r)
    run.batches = as_batches(data, batch_size, next((p.device for p in model.parameters()), None))
    run.mine = pick(run.batches, r)
    run.sites = list(sites) if sites is not None else find_heads(model, example=run.batches[0][0])
    closing = time.perf_counter()
    closed = [ablate_together(model, data, list(members), task=task, method=method, batch_size=batch_size,
                              sites=run.sites, distributed=r.active).to_json() for members in together]
    run.started += time.perf_counter() - closing  # the timing figures are the sweep's own
    with eval_mode(model), _progress(progress if r.main or callable(progress) else False) as bar, \
            gated(run.sites) as gates:
        _plan(run, gates, task, reuse, max_memory, bar)
        run.acc = Accumulator(len(run.sweep.heads))
        n_top = opts.n_top(len(run.sweep.heads))
        bar.total(len(run.mine) * (method == "mean")
                  + len(run.parts) * ((1 if fast else len(run.sites)) + (fast and n_top > 0)))
        if method == "mean":
            reduce = (lambda sums, counts: r.add_up(sums, counts, run.batches.device)) if r.active else None
            fills = r.together("averaging head outputs", lambda: run.sweep.mean_outputs(run.mine, bar.tick, reduce))
            for gate, fill in zip(gates, fills):
                gate.fill = fill
        run.chosen = _fast(run, opts, n_top, bar) if fast else _exact(run, bar)
        run.acc = merge(run.acc, r)
    run.ablation_seconds = time.perf_counter() - run.started
    summary = _attention(run, opts, tokens if tokens is not None else getattr(data, "tokens", None))
    result = _assemble(run, opts, summary)
    result.together = closed
    return result


@dataclass(frozen=True)
class _Options:
    """ablate_heads' settings, checked once."""

    task: str
    method: str
    batch_size: int | None
    fast: bool
    top: int | None
    alpha: float
    n_boot: int
    seed: int
    attention: bool
    keep: int
    reuse: bool
    correction: str
    min_effect: float
    rank_by: str

    def check(self) -> None:
        for name, value, allowed in (("task", self.task, TASKS), ("method", self.method, METHODS),
                                     ("correction", self.correction, significance.CORRECTIONS),
                                     ("rank_by", self.rank_by, RANKINGS)):
            if value not in allowed:
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if not (self.min_effect >= 0):
            raise ConfigError(f"min_effect must be 0 or more (a fraction of the baseline loss), got {self.min_effect}")
        if self.top is not None and int(self.top) < 0:
            raise ConfigError(f"top must be 0 or more, got {self.top}")

    def n_top(self, n_total: int) -> int:
        """How many heads are ablated exactly: all, or with fast the `top` (default DEFAULT_TOP)."""
        return n_total if not self.fast else min(n_total, DEFAULT_TOP if self.top is None else int(self.top))


@dataclass
class _Run:
    """What one call measures, step by step: batches and sites, the sweep and its sums, the heads ablated."""

    model: torch.nn.Module
    started: float
    ranks: Ranks = Ranks()
    batches: Batches | None = None
    mine: Sequence | None = None  # this rank's shard of the batches (all of them when alone)
    parts: Sequence | None = None  # `mine` cut into the plan's micro-batches, for the sweep's own passes
    plan: Plan | None = None
    sites: list[AttentionSite] | None = None
    sweep: Sweep | None = None
    acc: Accumulator | None = None
    chosen: list[int] | None = None
    ranking_seconds: float | None = None
    ablation_seconds: float = 0.0


def _plan(run: _Run, gates: list, task: str, reuse: bool, max_memory: int | str | None, bar: "_Bar") -> None:
    """Size the passes (plan.py), cut this rank's shard into them, and set up the sweep."""
    run.plan = plan_sweep(run.model, run.sites, run.batches, max_memory=max_memory)
    run.parts = micro_batches(run.mine, run.plan.micro_batch)  # this rank's shard, in the plan's pieces
    bar.describe(run.plan.describe())
    run.sweep = Sweep(run.model, run.sites, gates, task, reuse=reuse, replication=run.plan.replication)


def _exact(run: _Run, bar: "_Bar") -> list[int]:
    """Every head: one clean pass per batch of this rank's shard (with gradients), then every head ablated in it."""
    def work() -> None:
        for inputs, labels in run.parts:
            clean = run.sweep.clean(inputs, labels, grad=True, record=True)
            run.acc.add_clean(clean)
            run.acc.add_ablated(run.sweep.ablate(clean, range(run.acc.n_heads), bar.tick))

    run.ranks.together("ablating heads", work)
    return list(range(run.acc.n_heads))


def _fast(run: _Run, opts: _Options, n_top: int, bar: "_Bar") -> list[int]:
    """Rank every head from the clean passes by opts.rank_by, then ablate only the n_top first."""
    kept = run.ranks.together("ranking heads", lambda: _clean_passes(run, record=n_top > 0, bar=bar))
    run.ranking_seconds = time.perf_counter() - run.started
    score = merge(run.acc, run.ranks).fast_score(opts.rank_by)  # every rank ranks the same sums
    chosen = list(np.argsort(-score, kind="stable")[:n_top])

    def work() -> None:
        for i, (inputs, labels) in enumerate(run.parts if chosen else []):
            clean = kept[i] if kept is not None else run.sweep.clean(inputs, labels, grad=False, record=True)
            run.acc.add_ablated(run.sweep.ablate(clean, chosen), i)
            bar.tick()

    run.ranks.together("verifying the top heads", work)
    return chosen


def _clean_passes(run: _Run, *, record: bool, bar: "_Bar") -> list | None:
    """The clean passes of --fast; returns them while they fit KEEP_BYTES, else None (the
    verification then recomputes each clean pass)."""
    kept: list | None = []
    for inputs, labels in run.parts:
        clean = run.sweep.clean(inputs, labels, grad=True, record=record)
        run.acc.add_clean(clean)
        if kept is not None:
            kept.append(clean)
            if sum(c.nbytes() for c in kept) > KEEP_BYTES:
                kept = None
        bar.tick()
    return kept


def _attention(run: _Run, opts: _Options, tokens: Any) -> dict | None:
    """Each head's attention statistics and the kept examples' maps (None when opts.attention is off)."""
    if not opts.attention:
        return None
    with eval_mode(run.model):
        return summarise(run.model, run.sites, run.batches, opts.keep, tokens, ranks=run.ranks)


def _assemble(run: _Run, opts: _Options, summary: dict | None) -> HeadsResult:
    """The per-head effects, roles, correlations and flags, in one HeadsResult."""
    acc = run.acc
    heads = head_effects(acc, run.sweep.heads, len(run.sites), run.chosen, alpha=opts.alpha, n_boot=opts.n_boot,
                         seed=opts.seed, correction=opts.correction, summary=summary)
    baseline = {"accuracy": acc.clean_accuracy(), "loss": acc.clean_loss()}
    band = contrast.default_band(baseline["loss"], opts.min_effect)
    for h in heads:
        h.negligible = contrast.negligible(h, band) if h.verified else None
    roles.assign(heads)
    correlations = contrast.correlations([h for h in heads if h.verified])
    correlations["fast_vs_exact"] = dict(correlations[opts.rank_by])  # the same Spearman, under its own key
    fast_info = None
    if opts.fast:
        fast_info = {"top": opts.n_top(len(heads)), "ranked_by": opts.rank_by,
                     "seconds_ranking": run.ranking_seconds, "spearman_vs_exact": dict(correlations[opts.rank_by])}
    flags = contrast.flags_with_groups(heads, run.model, run.batches, opts.task, opts.method, run.sites, baseline,
                                       band, distributed=run.ranks.active)
    counts = run.ranks.gather((run.sweep.forwards, run.sweep.examples_forwarded, run.sweep.reuse))
    return HeadsResult(
        model=_model_info(run.model, run.sites), task=opts.task, method=opts.method, n_examples=acc.n_examples,
        n_units=int(acc.units()), baseline=baseline, heads=heads, correlations=correlations, flags=flags,
        timing={"seconds": time.perf_counter() - run.started, "ablation_seconds": run.ablation_seconds,
                "forward_passes": sum(c[0] for c in counts), "examples_forwarded": sum(c[1] for c in counts),
                "prefix_reuse": all(c[2] for c in counts), "batches": len(run.batches), "ranks": run.ranks.world,
                "micro_batch": run.plan.micro_batch, "replication": run.plan.replication,
                "memory_plan": run.plan.to_json()},
        significance=_significance_info(heads, len(run.chosen), acc.n_examples, opts, band),
        fast=fast_info, examples=summary["examples"] if summary else [])


def _model_info(model: torch.nn.Module, sites: list[AttentionSite]) -> dict[str, Any]:
    """family, n_layers, n_heads (one number, or one per layer), class, and shared layers if any."""
    family = sites[0].adapter.family if sites else "unknown"
    n_heads = sorted({s.n_heads for s in sites})
    info = {"family": family, "n_layers": len(sites), "n_heads": n_heads[0] if len(n_heads) == 1 else
            [s.n_heads for s in sites], "class": type(model).__name__}
    shared = shared_modules(sites)
    if shared:  # one layer applied at several depths (ALBERT): each application is its own site
        info["shared"] = shared
    return info


def _significance_info(heads: list[HeadEffect], n_tested: int, n_examples: int, opts: _Options, band: dict) -> dict:
    """How `significant` was decided, and the smallest accuracy effect this much data can show."""
    alpha, n_boot, seed = opts.alpha, opts.n_boot, opts.seed
    k = significance.min_detectable_examples(n_tested, alpha)
    detectable = k / max(n_examples, 1)
    return {"test": significance.TEST, "loss_test": significance.LOSS_TEST, "drives": significance.DRIVES,
            "correction": opts.correction, "alpha": alpha, "n_tested": n_tested,
            "n_significant": sum(bool(h.significant) for h in heads),
            "n_significant_accuracy": sum(h.p_value_adjusted is not None and h.p_value_adjusted < alpha
                                          for h in heads),
            "n_flips": significance.flips_needed(n_tested, alpha),
            "ci": f"paired bootstrap, {n_boot} resamples of examples, seed {seed}",
            "min_detectable_examples": k, "min_detectable_accuracy": detectable,
            "power_note": (f"with {n_examples} examples and {n_tested} heads tested, the accuracy test cannot tell a "
                           f"head from noise unless at least {k} examples change one way ({detectable:.1%} of the "
                           f"examples for one scored unit each); pass more data to see smaller accuracy effects"),
            "negligible_band": band}


class _Bar:
    def __init__(self, on_step: Callable[[int, int], None] | None):
        self.on_step, self.done, self.n = on_step, 0, 0
        self.on_describe: Callable[[str], None] | None = None

    def total(self, n: int) -> None:
        self.n = n

    def describe(self, text: str) -> None:
        """What the sweep chose (micro-batch, heads per forward), shown beside the bar."""
        if self.on_describe is not None:
            self.on_describe(text)

    def tick(self) -> None:
        self.done += 1
        if self.on_step is not None:
            self.on_step(self.done, self.n)


@contextmanager
def _progress(progress) -> Iterator[_Bar]:
    """A rich bar on stderr for progress=True, the caller's callable, or nothing."""
    if callable(progress):
        yield _Bar(progress)
        return
    if not progress:
        yield _Bar(None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("ablating heads"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)
        shown = _Bar(lambda done, n: bar.update(task, completed=done, total=n))

        def describe(text: str) -> None:
            if console.is_terminal:  # stays after the bar goes; elsewhere stderr keeps to errors
                console.print(f"ablating heads: {text}", highlight=False, markup=False)
            bar.update(task, description=text)
        shown.on_describe = describe
        yield shown
