"""ablate_heads: remove each attention head in turn and measure what the model loses.

The options are one AblationConfig (config.py). The memory plan sizes the passes (plan.py), the
method's data pass runs once (methods.py: mean ablation averages each head's output over the data),
then one clean pass per batch through the head gates gives the baseline, d loss / d gate
(gradient importance) and the block outputs for prefix reuse; the ablations follow,
several heads per forward (steps.py, the same steps prune's rounds use). `fast=True`
ranks every head by a cheap estimate from that one clean pass (FAST_RANK: the change of the
loss to second order, the curvature from the same per-example gradients; it tracked the
exact effect best on real and demo models, see bench/bench_estimators.py) and ablates only
the top ones exactly. Last, the registered analysis steps (analyses.py) each add a Section.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import numpy as np
import torch

from .._distributed import Ranks, pick, ranks
from ..adapters.base import AttentionSite
from ..adapters.shared import shared_modules
from ..errors import ConfigError
from ..modes import eval_mode
from ..objectives import batch_size_of
from ..sites import find_heads
from . import contrast, roles, significance, verdict
from .analyses import AnalysisInput, run_analyses
from .accumulate import Accumulator, head_effects
from .attention import summarise
from .batches import Batches, as_batches, for_last_position, wrong_labels
from . import direct as _direct
from .config import DEFAULT_TOP, FAST_RANK, MIN_EFFECT, RANKINGS, AblationConfig
from .gate import gated
from .methods import METHODS, DataPass, Prepared, check_compared_draws, get_method, method_names, prepare
from .plan import Plan, micro_batches, plan_sweep
from .progress import Progress, ProgressCallback
from .resample import DRAWS, check_donor_table, resample_outputs
from .result import HeadEffect, HeadsResult
from .scored import ScoredOnly, output_layer
from .self_repair import add_direct
from .steps import KEEP_BYTES, every_head_under, first_example, ranked_heads
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
    return _run(model, data, [cfg], sites, tokens, progress)[0]


def _run(model: torch.nn.Module, data: Any, cfgs: list[AblationConfig], sites: Sequence[AttentionSite] | None,
         tokens: Sequence[Sequence[str]] | None, progress: ProgressCallback | None) -> list[HeadsResult]:
    """ablate_heads under each config (configs that differ in the method only), in one sweep whose clean
    passes and prefixes all of them share; the attention summary is the first config's."""
    cfg = cfgs[0]
    bar = Progress(progress)
    r = ranks(cfg.distributed)
    started = time.perf_counter()
    batches = as_batches(data, cfg.batch_size, next((p.device for p in model.parameters()), None))
    _check_donors(batches, cfgs)  # before any forward: a donor table too large for memory is said now
    scored = for_last_position(model, batches, cfg.task)
    if scored is not batches:  # scored on the token after the last input: one position fewer
        known = tokens if tokens is not None else getattr(data, "tokens", None)
        tokens = None if known is None else [list(t)[:-1] for t in known]
        batches, data = scored, scored
    wrong = wrong_labels(data) if scored is batches else None  # a last-position cut moves the labels
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    closing = time.perf_counter()
    groups = [[ablate_together(model, data, list(members), config=c, sites=sites, distributed=r.active).to_json()
               for members in c.together] for c in cfgs]
    started += time.perf_counter() - closing  # the timing figures are the sweep's own
    with eval_mode(model), gated(sites) as gates:
        measured = _sweep(model, sites, gates, batches, cfgs, r, bar, started, wrong=wrong)
    if cfg.attention:
        bar.stage("attention statistics")
    summary = _attention(model, sites, batches, r, cfg, tokens if tokens is not None else getattr(data, "tokens", None))
    results = []
    for i, (c, m, together) in enumerate(zip(cfgs, measured, groups)):
        bar.stage("look-alike heads closed together" + (f" ({c.method})" if len(cfgs) > 1 else ""))
        result = _assemble(model, sites, batches, r, c, m, summary if i == 0 else None, started)
        result.together = together
        results.append(result)
    bar.stage("analyses")
    with eval_mode(model):  # the analysis steps (analyses.py): the first config's result, its sections
        results[0].sections = run_analyses(AnalysisInput(model, sites, batches, cfg, results[0], r.active))
    return results


def ablate_methods(model: torch.nn.Module, data: Any, methods: Sequence[str], *, config: AblationConfig | None = None,
                   draws: int | None = None, sites: Sequence[AttentionSite] | None = None,
                   progress: ProgressCallback | None = None, **options: Any) -> HeadsResult:
    """ablate_heads under each method (same settings otherwise; `draws` for the random fills only); the first
    method's result, with `agreement` (verdict.agreement: each head's verdict per method, and the heads
    whose verdict depends on the method) and its flags on such heads marked `depends_on_method`. One sweep
    serves all methods: each batch's clean pass and prefixes are computed once (with --fast each method
    ranks from its own clean passes, as the gradient depends on the fill). The attention summary, the
    groups closed together and the direct effects are the first method's."""
    names = method_names(methods)
    check_compared_draws(names, draws)
    if len(names) < 2:
        raise ConfigError(f"methods: name at least two different methods to compare, got {', '.join(names)}")
    cfg = AblationConfig.of(config, options)
    # the methods after the first only vote on each head's verdict: no attention summary, groups or direct paths
    configs = [AblationConfig.of(cfg, {"method": name, "draws": None if get_method(name).foldable else draws,
                                       **({} if i == 0 else {"attention": False, "together": (), "direct": False})})
               for i, name in enumerate(names)]  # every name and its draws checked before any sweep
    results = dict(zip(names, _run(model, data, configs, sites, None, progress)))
    first = results[names[0]]
    first.timing["shared_methods"] = None if cfg.fast else names  # forward passes: all methods' together
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
    logits: dict  # whether the logits were made at the scored positions only (scored.py), or why not


def _check_donors(batches: Batches, cfgs: list[AblationConfig]) -> None:
    """Resample's donor table [examples, draws] checked against max_memory and the free memory."""
    n = sum(batch_size_of(x) for x, _ in batches)
    for c in cfgs:
        if get_method(c.method).prepare is resample_outputs:
            check_donor_table(n, c.draws or DRAWS, c.max_memory)


def _sweep(model: torch.nn.Module, sites: list[AttentionSite], gates: list, batches: Batches,
           cfgs: list[AblationConfig], r: Ranks, bar: Progress, started: float, *,
           wrong: torch.Tensor | None = None) -> list[_Measured]:
    """Plan the passes, run each method's data pass, then every head (all methods sharing the clean passes)
    or the ranked way (one method after the other; steps.py). The configs differ in the method only."""
    cfg = cfgs[0]
    mine = pick(batches, r)
    scored = ScoredOnly(output_layer(model, sites))
    plan = plan_sweep(model, sites, batches, max_memory=cfg.max_memory, scored=scored, task=cfg.task)
    parts = micro_batches(mine, plan.micro_batch)  # this rank's shard, in the plan's pieces
    probe = micro_batches(batches[:1], plan.micro_batch)[0]  # the data set's first piece: the same on every rank
    bar.note(plan.describe())
    sweep = Sweep(model, sites, gates, cfg.task, reuse=cfg.reuse, replication=plan.replication, scored=scored)
    sweep.wrong = wrong
    n_top = cfg.n_top(len(sweep.heads))
    methods = [get_method(c.method) for c in cfgs]
    prep = len(mine) * sum(m.prepare is not None for m in methods)  # steps: a data pass per batch, then
    per_part = (1 + (n_top > 0)) if cfg.fast else len(sweep.heads)  # a clean pass and a check, or a step per head
    bar.total(prep + len(parts) * len(cfgs) * per_part, first=prep + per_part)
    bar.forwards = lambda: sweep.forwards
    reduce = (lambda sums, counts: r.add_up(sums, counts, batches.device)) if r.active else None
    first = first_example(batches, r)
    prepared = []
    for method, c in zip(methods, cfgs):
        data_pass = DataPass(sweep, mine, reduce, bar.tick, first, c.draws, c.seed)
        state = r.run_local(f"preparing the {method.name} ablation", partial(prepare, method, data_pass))
        prepared.append(Prepared(method, state, sweep.draws))
    ranked_at: list[float] = []
    if cfg.fast:
        def choose(acc: Accumulator) -> list[int]:
            ranked_at.append(time.perf_counter() - started)
            return list(np.argsort(-acc.fast_score(cfg.rank_by), kind="stable")[:n_top])
        runs = []
        for p in prepared:
            p.use(sweep)
            runs.append(ranked_heads(sweep, parts, first, r, choose, record=n_top > 0, tick=bar.tick))
    else:
        fills = [p.use for p in prepared] if len(prepared) > 1 else [None]  # one method: its fill is set
        everyone = list(range(len(sweep.heads)))
        runs = [(acc, everyone) for acc in every_head_under(sweep, parts, first, r, fills, bar.tick)]
    ablation_seconds = time.perf_counter() - started
    direct = []
    for c, p, (_, chosen) in zip(cfgs, prepared, runs):
        p.use(sweep)
        direct.append(_direct_effects(model, sweep, parts, probe, first, r, chosen, c, bar) if c.direct
                      else (None, None))
    counts = r.gather((sweep.forwards, sweep.examples_forwarded, sweep.reuse))
    return [_Measured(acc, chosen, sweep.heads, plan, ranked_at[0] if ranked_at else None, ablation_seconds, counts,
                      direct_acc, direct_info, scored.to_json()) for (acc, chosen), (direct_acc, direct_info) in zip(runs, direct)]


def _direct_effects(model: torch.nn.Module, sweep: Sweep, parts: list, probe: tuple, first: int, r: Ranks,
                    chosen: list[int], cfg: AblationConfig, bar: Progress) -> tuple[Accumulator | None, dict]:
    """The direct effects of the chosen heads (direct.py), or None and the one-line reason they cannot be had.
    Whether they can is judged on `probe`, the data set's first piece, so every rank decides alike (a rank
    with no batch of its own, when there are fewer batches than ranks, still joins the passes' collectives)."""
    paths, reason = _direct.readiness(sweep.sites, model, probe[0])
    if paths is not None and not chosen:
        paths, reason = None, "no head was ablated exactly (--top 0), so there is no total effect to set beside one"
    if paths is None:
        return None, {"measured": False, "reason": reason}
    passes = _direct.passes(sweep, paths)
    reason = passes.verify(*probe[:2])
    if reason is not None:
        return None, {"measured": False, "reason": reason}
    swept = bar.forwards
    bar.forwards = lambda: (swept() if swept else 0) + passes.forwards  # the sweep's and these passes'
    per_part = passes.steps(1, chosen)
    bar.stage("direct effects", len(parts) * per_part, first=per_part)
    acc = passes.run(parts, first, r, chosen, tick=bar.tick)
    forwards = r.gather(passes.forwards)
    return acc, {"measured": True, "n_heads": len(chosen), "norm": _direct.NORM, "method": cfg.method,
                 "path": _direct.path_of(paths),
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
    if acc.clean_logit_diff() is not None:
        baseline["logit_diff"] = acc.clean_logit_diff()
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
    flags = contrast.flags_with_groups(heads, model, batches, cfg, sites, baseline, band, distributed=r.active)
    return HeadsResult(
        model=_model_info(model, sites), task=cfg.task, method=cfg.method, n_examples=acc.n_examples,
        n_units=int(acc.units()), baseline=baseline, heads=heads, correlations=correlations, flags=flags,
        timing={"seconds": time.perf_counter() - started, "ablation_seconds": m.ablation_seconds,
                "forward_passes": sum(c[0] for c in m.counts), "examples_forwarded": sum(c[1] for c in m.counts),
                "prefix_reuse": all(c[2] for c in m.counts), "batches": len(batches), "ranks": r.world,
                "micro_batch": m.plan.micro_batch, "replication": m.plan.replication,
                "memory_plan": m.plan.to_json(), "logits": m.logits},
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
