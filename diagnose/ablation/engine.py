"""ablate_heads: remove each attention head in turn and measure what the model loses.

The options are one AblationConfig (config.py). The memory plan sizes the passes (plan.py), the
method's data pass runs once (methods.py: mean ablation averages each head's output over the data),
then one clean pass per batch through the head gates gives the baseline, d loss / d gate
(gradient importance) and the block outputs for prefix reuse; the ablations follow,
several heads per forward (steps.py, the same steps prune's rounds use). `fast=True`
ranks every head by a cheap estimate from that one clean pass (FAST_RANK: the change of the
loss to second order, the curvature from the same per-example gradients; it tracked the
exact effect best on real and demo models, see bench/bench_estimators.py) and ablates only
the top ones exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .._distributed import Ranks, pick, ranks
from ..adapters.base import AttentionSite
from ..adapters.shared import shared_modules
from ..errors import ConfigError
from ..modes import eval_mode
from ..sites import find_heads
from . import contrast, roles, significance, verdict
from .accumulate import Accumulator, head_effects
from .attention import summarise
from .batches import Batches, as_batches
from . import direct as _direct
from .config import DEFAULT_TOP, FAST_RANK, MIN_EFFECT, RANKINGS, AblationConfig
from .gate import gated
from .methods import METHODS, DataPass, get_method, prepare
from .plan import Plan, micro_batches, plan_sweep
from .progress import Progress, ProgressCallback
from .result import HeadEffect, HeadsResult
from .self_repair import add_direct
from .steps import KEEP_BYTES, every_head, first_example, ranked_heads
from .sweep import Sweep
from .together import ablate_together

__all__ = ["DEFAULT_TOP", "FAST_RANK", "KEEP_BYTES", "METHODS", "MIN_EFFECT", "RANKINGS", "AblationConfig",
           "ablate_heads", "ablate_methods"]


def ablate_heads(model: torch.nn.Module, data: Any, *, config: AblationConfig | None = None,
                 sites: Sequence[AttentionSite] | None = None, tokens: Sequence[Sequence[str]] | None = None,
                 progress: ProgressCallback | None = None, **options: Any) -> HeadsResult:
    """Ablate every head (or, with fast=True, the `top` heads by the rank_by estimate) and test each effect.

    data: a DataSet / TaskData / dict with input_ids (cut into batch_size batches) or an iterable of
    (inputs, labels) pairs. options: the fields of AblationConfig (task, method, batch_size, fast, top,
    alpha, n_boot, seed, attention, keep, reuse, correction, min_effect, rank_by, together, distributed,
    max_memory), laid over `config` when one is given. sites: the attention sites (default: found).
    tokens: token strings per example for the kept maps (default: data.tokens, else the ids).
    progress: a callable receiving a ProgressEvent per step (None: silent).

    Under torch.distributed each rank sweeps a contiguous shard; the per-example outcomes are gathered,
    so every rank returns the result one process would (write it from rank 0 only). Call it on every
    rank with the same model, data and settings.
    """
    cfg = AblationConfig.of(config, options)
    bar = Progress(progress)
    r = ranks(cfg.distributed)
    started = time.perf_counter()
    batches = as_batches(data, cfg.batch_size, next((p.device for p in model.parameters()), None))
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    closing = time.perf_counter()
    groups = [ablate_together(model, data, list(members), task=cfg.task, method=cfg.method, draws=cfg.draws,
                              seed=cfg.seed, batch_size=cfg.batch_size, sites=sites, distributed=r.active).to_json()
              for members in cfg.together]
    started += time.perf_counter() - closing  # the timing figures are the sweep's own
    with eval_mode(model), gated(sites) as gates:
        measured = _sweep(model, sites, gates, batches, cfg, r, bar, started)
    summary = _attention(model, sites, batches, r, cfg, tokens if tokens is not None else getattr(data, "tokens", None))
    result = _assemble(model, sites, batches, r, cfg, measured, summary, started)
    result.together = groups
    return result


def ablate_methods(model: torch.nn.Module, data: Any, methods: Sequence[str], *, config: AblationConfig | None = None,
                   draws: int | None = None, sites: Sequence[AttentionSite] | None = None,
                   progress: ProgressCallback | None = None, **options: Any) -> HeadsResult:
    """ablate_heads once per method (same settings otherwise; `draws` for the random fills only); the first
    method's result, with `agreement` (verdict.agreement: each head's verdict per method, and the heads
    whose verdict depends on the method) and its flags on such heads marked `depends_on_method`. The
    attention summary is taken once, by the first method's sweep."""
    names = list(dict.fromkeys(methods))
    if len(names) < 2:
        raise ConfigError(f"methods: name at least two different methods to compare, got {', '.join(names)}")
    cfg = AblationConfig.of(config, options)
    configs = {name: AblationConfig.of(cfg, {"method": name, "attention": cfg.attention and i == 0,
                                             "draws": None if get_method(name).foldable else draws})
               for i, name in enumerate(names)}  # every name and its draws checked before any sweep
    results = {name: ablate_heads(model, data, config=c, sites=sites, progress=progress)
               for name, c in configs.items()}
    first = results[names[0]]
    first.agreement = verdict.agreement(results)
    depends = {tuple(m) for m in first.agreement["depends"]}
    for f in first.flags:
        members = [tuple(m) for m in f.get("heads") or [(f.get("layer"), f.get("head"))]]
        if any(m in depends for m in members):
            f["depends_on_method"] = True
    return first


@dataclass(frozen=True)
class _Measured:
    """What the sweep measured: all ranks' sums, the heads ablated exactly, the plan, the counts."""

    acc: Accumulator
    chosen: list[int]
    heads: list[tuple[int, int]]  # (site, head) in the sweep's global order
    plan: Plan
    ranking_seconds: float | None
    ablation_seconds: float
    counts: list[tuple[int, int, bool]]  # per rank: forwards, examples forwarded, prefix reuse kept
    direct: Accumulator | None  # the direct-path outcomes of the chosen heads (None: not measured)
    direct_info: dict | None  # how they were measured, or why not (result.direct)


def _sweep(model: torch.nn.Module, sites: list[AttentionSite], gates: list, batches: Batches, cfg: AblationConfig,
           r: Ranks, bar: Progress, started: float) -> _Measured:
    """Plan the passes, run the method's data pass, then every head or the ranked way (steps.py)."""
    mine = pick(batches, r)
    plan = plan_sweep(model, sites, batches, max_memory=cfg.max_memory)
    parts = micro_batches(mine, plan.micro_batch)  # this rank's shard, in the plan's pieces
    bar.note(plan.describe())
    sweep = Sweep(model, sites, gates, cfg.task, reuse=cfg.reuse, replication=plan.replication)
    n_top = cfg.n_top(len(sweep.heads))
    method = get_method(cfg.method)
    bar.total(len(mine) * (method.prepare is not None)
              + len(parts) * ((1 if cfg.fast else len(sites)) + (cfg.fast and n_top > 0)))
    reduce = (lambda sums, counts: r.add_up(sums, counts, batches.device)) if r.active else None
    first = first_example(batches, r)
    r.run_local(f"preparing the {method.name} ablation",
                lambda: prepare(method, DataPass(sweep, mine, reduce, bar.tick, first, cfg.draws, cfg.seed)))
    ranked_at: list[float] = []
    if cfg.fast:
        def choose(acc: Accumulator) -> list[int]:
            ranked_at.append(time.perf_counter() - started)
            return list(np.argsort(-acc.fast_score(cfg.rank_by), kind="stable")[:n_top])
        acc, chosen = ranked_heads(sweep, parts, first, r, choose, record=n_top > 0, tick=bar.tick)
    else:
        acc, chosen = every_head(sweep, parts, first, r, bar.tick), list(range(len(sweep.heads)))
    ablation_seconds = time.perf_counter() - started
    direct_acc, direct_info = (_direct_effects(model, sweep, parts, first, r, chosen, cfg) if cfg.direct
                               else (None, None))
    counts = r.gather((sweep.forwards, sweep.examples_forwarded, sweep.reuse))
    return _Measured(acc, chosen, sweep.heads, plan, ranked_at[0] if ranked_at else None,
                     ablation_seconds, counts, direct_acc, direct_info)


def _direct_effects(model: torch.nn.Module, sweep: Sweep, parts: list, first: int, r: Ranks, chosen: list[int],
                    cfg: AblationConfig) -> tuple[Accumulator | None, dict]:
    """The direct effects of the chosen heads (direct.py), or None and the one-line reason they cannot be had."""
    norm, reason = _direct.readiness(sweep.sites, model)
    if norm is not None and not chosen:
        norm, reason = None, "no head was ablated exactly (--top 0), so there is no total effect to set beside one"
    if norm is None:
        return None, {"measured": False, "reason": reason}
    passes = _direct.Direct(sweep, norm)
    acc = passes.run(parts, first, r, chosen)
    forwards = r.gather(passes.forwards)
    return acc, {"measured": True, "n_heads": len(chosen), "norm": _direct.NORM, "method": cfg.method,
                 "seconds": passes.seconds, "forward_passes": sum(forwards),
                 "blocks_replayed": bool(passes.replay_ok) and sweep.recorder is not None}


def _attention(model: torch.nn.Module, sites: list[AttentionSite], batches: Batches, r: Ranks, cfg: AblationConfig,
               tokens: Any) -> dict | None:
    """Each head's attention statistics and the kept examples' maps (None when cfg.attention is off)."""
    if not cfg.attention:
        return None
    with eval_mode(model):
        return summarise(model, sites, batches, cfg.keep, tokens, ranks=r)


def _assemble(model: torch.nn.Module, sites: list[AttentionSite], batches: Batches, r: Ranks, cfg: AblationConfig,
              m: _Measured, summary: dict | None, started: float) -> HeadsResult:
    """The per-head effects, roles, correlations and flags, in one HeadsResult."""
    acc = m.acc
    heads = head_effects(acc, m.heads, len(sites), m.chosen, alpha=cfg.alpha, n_boot=cfg.n_boot,
                         seed=cfg.seed, correction=cfg.correction, summary=summary)
    baseline = {"accuracy": acc.clean_accuracy(), "loss": acc.clean_loss()}
    band = contrast.default_band(baseline["loss"], cfg.min_effect)
    for h in heads:
        h.negligible = contrast.negligible(h, band) if h.verified else None
        h.verdict = verdict.verdict(h, band)
    if m.direct is not None:
        add_direct(heads, m.direct, m.chosen, band, alpha=cfg.alpha, n_boot=cfg.n_boot, seed=cfg.seed,
                   correction=cfg.correction)
    roles.assign(heads)
    correlations = contrast.correlations([h for h in heads if h.verified])
    correlations["fast_vs_exact"] = dict(correlations[cfg.rank_by])  # the same Spearman, under its own key
    fast_info = None
    if cfg.fast:
        fast_info = {"top": cfg.n_top(len(heads)), "ranked_by": cfg.rank_by,
                     "seconds_ranking": m.ranking_seconds, "spearman_vs_exact": dict(correlations[cfg.rank_by])}
    flags = contrast.flags_with_groups(heads, model, batches, cfg.task, cfg.method, sites, baseline,
                                       band, distributed=r.active, draws=cfg.draws, seed=cfg.seed)
    return HeadsResult(
        model=_model_info(model, sites), task=cfg.task, method=cfg.method, n_examples=acc.n_examples,
        n_units=int(acc.units()), baseline=baseline, heads=heads, correlations=correlations, flags=flags,
        timing={"seconds": time.perf_counter() - started, "ablation_seconds": m.ablation_seconds,
                "forward_passes": sum(c[0] for c in m.counts), "examples_forwarded": sum(c[1] for c in m.counts),
                "prefix_reuse": all(c[2] for c in m.counts), "batches": len(batches), "ranks": r.world,
                "micro_batch": m.plan.micro_batch, "replication": m.plan.replication,
                "memory_plan": m.plan.to_json()},
        significance=_significance_info(heads, len(m.chosen), acc.n_examples, cfg, band),
        fast=fast_info, examples=summary["examples"] if summary else [], direct=m.direct_info)


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


def _significance_info(heads: list[HeadEffect], n_tested: int, n_examples: int, cfg: AblationConfig,
                       band: dict) -> dict:
    """How `significant` was decided, and the smallest accuracy effect this much data can show."""
    alpha, n_boot, seed = cfg.alpha, cfg.n_boot, cfg.seed
    k = significance.min_detectable_examples(n_tested, alpha)
    detectable = k / max(n_examples, 1)
    return {"test": significance.TEST, "loss_test": significance.LOSS_TEST, "drives": significance.DRIVES,
            "correction": cfg.correction, "alpha": alpha, "n_tested": n_tested,
            "n_significant": sum(bool(h.significant) for h in heads),
            "verdicts": verdict.count(heads),
            "n_significant_accuracy": sum(h.p_value_adjusted is not None and h.p_value_adjusted < alpha
                                          for h in heads),
            "n_flips": significance.flips_needed(n_tested, alpha),
            "ci": f"paired bootstrap, {n_boot} resamples of examples, seed {seed}",
            "min_detectable_examples": k, "min_detectable_accuracy": detectable,
            "power_note": (f"with {n_examples} examples and {n_tested} heads tested, the accuracy test cannot tell a "
                           f"head from noise unless at least {k} examples change one way ({detectable:.1%} of the "
                           f"examples for one scored unit each); pass more data to see smaller accuracy effects"),
            "negligible_band": band}
