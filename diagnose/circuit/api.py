"""find_circuit: which heads feed which, with the evidence `diagnose heads` gives single heads.

One call: the data into batches, the method's fill prepared on the head gates (methods.py), the wiring
read from the adapters (wiring.py); the edge attribution ranks every edge (attribution.py), the top ones
(every edge, on a small model) are patched exactly one at a time (patch.py) and tested (evidence.py);
last the minimal circuit, its stability, and whether it holds under each other method (minimal.py).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from ..ablation import contrast, significance
from ..ablation.batches import as_batches, for_last_position, wrong_labels
from .._distributed import ranks
from ..ablation.attention import summarise
from ..ablation.gate import gated
from ..ablation.config import MAX_BOOT, AblationConfig, whole_in
from ..ablation.methods import DataPass, Prepared, check_compared_draws, get_method, method_names, prepare
from ..ablation.plan import micro_batches, plan_sweep
from ..ablation.progress import Progress, ProgressCallback
from ..ablation.sweep import Sweep
from .._numbers import number
from ..errors import ConfigError
from ..modes import eval_mode
from ..objectives import TASKS, default_task
from ..sites import find_heads
from .attribution import ESTIMATORS, attribute, spearman
from .edges import Edge, all_edges
from .evidence import edge_effects
from .minimal import RESAMPLES, Search, minimal, removed_sets
from .mlp import mlp_gated
from .patch import Patcher
from .shards import Shard
from .result import CircuitResult, name_heads
from .wiring import wiring

EXACT_ALL = 256  # at most this many edges: every one is patched exactly (no ranking needed)
DEFAULT_TOP = 50


def find_circuit(model: torch.nn.Module, data: Any, *, method: str = "zero", methods: Sequence[str] | None = None,
                 top: int | None = None, faithfulness: float = 0.8, estimator: str = "eap", task: str | None = None,
                 batch_size: int | None = None, draws: int | None = None, seed: int = 0, alpha: float = 0.05,
                 n_boot: int = 2000, correction: str = "holm", min_effect: float = 0.05, resamples: int = RESAMPLES,
                 sites: Sequence | None = None, mlps: bool = True, distributed: bool | None = None,
                 progress: ProgressCallback | None = None) -> CircuitResult:
    """Path-patch the edges between heads, MLPs and the output, test each, and find the minimal circuit.

    methods: the methods the circuit is checked under (the first is the main one, else `method`). top: edges
    verified exactly (default: every edge when there are at most EXACT_ALL, else the DEFAULT_TOP the
    estimator ranks first). faithfulness: the share of the loss gap (every edge removed to none) the circuit
    keeps. estimator: 'eap' or 'eap-ig'. mlps: each layer's MLP is a node where the adapter declares it
    (else, or False, the nodes are the heads and `notes` says why). distributed: as ablate_heads (None: shard
    the examples over an initialised torch.distributed group's ranks, each returning the whole result;
    shards.py). progress: a callable receiving a ProgressEvent per step of each stage (the methods' data
    passes, the attribution, the exact patching, the minimal circuit, ...; each names its stage). The rest as in
    ablate_heads."""
    names = method_names(methods) if methods is not None else [method]
    _check(faithfulness, estimator, top, correction)
    _check_numbers(names or [method], task, batch_size, draws, seed, alpha, n_boot, min_effect, resamples)
    names = names or [method]
    bar = Progress(progress)
    started = time.perf_counter()
    batches = as_batches(data, batch_size, next((p.device for p in model.parameters()), None))
    task = task or default_task(model, data)
    scored = for_last_position(model, batches, task)
    wrong = wrong_labels(data) if scored is batches else None  # a last-position cut moves the labels
    batches = scored
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    shard = Shard.of(batches, ranks(distributed))
    with eval_mode(model), gated(sites) as gates:
        sweep = Sweep(model, sites, gates, task)  # reuse: the blocks before a moved input replay (patch.py)
        sweep.wrong = wrong  # the logit difference label - wrong answer beside the loss, as the heads' sweep
        wired = wiring(model, sites, batches[0][0], mlps=mlps)
        with mlp_gated(wired.mlps) as mlp_gates:
            # the methods' fills for every node from one data pass: an MLP is one head as wide as the stream
            nodes = Nodes(sweep, Sweep(model, [*sites, *(m.site for m in wired.mlps)], [*gates, *mlp_gates], task,
                                       reuse=False))
            device = getattr(batches, "device", None)
            bar.forwards = lambda: nodes.all.forwards
            prepared = [_prepare(nodes.all, shard, device, name, draws, seed, bar) for name in names]
            nodes.use(prepared[0])
            patcher = Patcher(sweep, wired, all_edges(sites, [m.site.layer for m in wired.mlps]),
                              mlp_gates=mlp_gates)
            patcher.tick, bar.forwards = bar.tick, lambda: patcher.forwards
            return _measure(model, sites, patcher, nodes, batches, shard, prepared, started, bar, task=task, top=top,
                            target=faithfulness, estimator=estimator, alpha=alpha, n_boot=n_boot, seed=seed,
                            correction=correction, min_effect=min_effect, resamples=resamples)


class Nodes:
    """The heads' sweep (the patcher's) and the sweep over every node's gate (heads and MLPs) that the
    methods are prepared on: `use` sets a prepared method's fills on every gate and its draws on both."""

    def __init__(self, heads: Sweep, every: Sweep):
        self.heads, self.all = heads, every

    def use(self, prepared: Prepared) -> None:
        prepared.use(self.all)
        self.heads.draws = prepared.draws


def _check(faithfulness: float, estimator: str, top: int | None, correction: str) -> None:
    share = number(faithfulness)
    if share is None or not 0 < share <= 1:
        raise ConfigError(f"faithfulness is a share of the metric in (0, 1], got {faithfulness!r:.40}")
    if not isinstance(estimator, str) or estimator not in ESTIMATORS:
        raise ConfigError(f"estimator {estimator!r:.40} is not one of {', '.join(ESTIMATORS)}")
    whole_in("top (edges verified exactly)", top, 1, None, optional=True)
    if not isinstance(correction, str) or correction not in significance.CORRECTIONS:
        raise ConfigError(f"correction {correction!r} is not one of {', '.join(significance.CORRECTIONS)}")


def _check_numbers(names: list[str], task: str | None, batch_size, draws, seed, alpha, n_boot, min_effect,
                   resamples) -> None:
    """The settings find_circuit shares with ablate_heads checked as AblationConfig checks them, before any work
    (a seed of -1 crashed the bootstrap at the end; a draws no method uses was ignored)."""
    check_compared_draws(names, draws)
    AblationConfig(task=task or TASKS[0], method=names[0], batch_size=batch_size, seed=seed, alpha=alpha,
                   n_boot=n_boot, min_effect=min_effect)
    whole_in("resamples", resamples, 1, MAX_BOOT)


def _prepare(sweep: Sweep, shard: Shard, device, name: str, draws: int | None, seed: int, bar: Progress) -> Prepared:
    entry = get_method(name)
    if entry.prepare is not None:
        bar.stage(f"preparing the {name} ablation", len(shard.batches), first=1)
    data_pass = DataPass(sweep, shard.batches, shard.reduce(device), bar.tick, shard.first,
                         draws=None if entry.foldable else draws, seed=seed)
    state = shard.ranks.run_local(f"preparing the {name} ablation", lambda: prepare(entry, data_pass))
    return Prepared(entry, state, sweep.draws)


def _measure(model, sites, patcher: Patcher, nodes: Nodes, batches, shard: Shard, prepared: list[Prepared],
             started: float, bar: Progress, *, task: str, top: int | None, target: float, estimator: str, alpha: float,
             n_boot: int, seed: int, correction: str, min_effect: float, resamples: int) -> CircuitResult:
    edges = patcher.edges
    plan = plan_sweep(model, sites, batches, task=task)  # as the head sweep: rows per forward that fit the cache
    patcher.per_forward = plan.replication
    t0 = time.perf_counter()
    estimates = None
    if len(edges) > EXACT_ALL or top is not None:
        bar.stage(f"attributing {len(edges)} edges ({estimator})", len(shard.batches), first=1)
        estimates = shard.ranks.run_local("attributing the edges", lambda: attribute(
            patcher, shard.batches, estimator, shard.first, shard.reduce(getattr(batches, "device", None))))
    t_attr = time.perf_counter() - t0
    parts = micro_batches(shard.batches, plan.micro_batch)
    chosen = _chosen(edges, estimates, top)
    one = torch.zeros(len(chosen), len(edges), dtype=torch.bool)
    index = {e: i for i, e in enumerate(edges)}
    for j, e in enumerate(chosen):
        one[j, index[e]] = True
    t0 = time.perf_counter()
    per_part = -(-len(chosen) // max(patcher.per_forward, 1))
    bar.stage(f"patching {len(chosen)} edges exactly", len(parts) * per_part, first=per_part)
    measured = shard.over_data(patcher, parts, one)
    t_exact = time.perf_counter() - t0
    units = float(max(measured.count.sum(), 1.0))
    baseline = {"loss": float(measured.loss_sum.sum()) / units, "accuracy": float(measured.correct.sum()) / units}
    if measured.diff is not None:
        baseline["logit_diff"] = float(measured.diff.sum()) / max(float(measured.diff_count.sum()), 1.0)
    band = contrast.default_band(baseline["loss"], min_effect)
    effects = edge_effects(measured, chosen, alpha=alpha, n_boot=n_boot, seed=seed, correction=correction, band=band)
    if estimates is not None:
        for e in effects:
            e.estimate = float(estimates[index[e.edge]])
    order = sorted(range(len(effects)), key=lambda j: -effects[j].delta_loss)
    effects = [effects[j] for j in order]
    per_edge = (measured.set_loss - measured.loss_sum[:, None])[:, order]  # [N, M]
    circuit = _circuit(patcher, shard, parts, edges, effects, per_edge, prepared, nodes, bar, target=target,
                       resamples=resamples, n_boot=n_boot, seed=seed, units=units)
    bar.stage("attention statistics")
    return CircuitResult(
        model={"family": sites[0].adapter.family, "n_layers": len(sites), "heads": [s.n_heads for s in sites],
               "mlps": [m.site.layer for m in patcher.mlps]},
        task=task, method=prepared[0].method.name, n_examples=len(measured.count), n_units=int(units),
        baseline=baseline, band=band,
        significance={"loss_test": significance.LOSS_TEST, "accuracy_test": significance.TEST,
                      "correction": correction, "alpha": alpha, "n_tested": len(chosen)},
        n_edges=len(edges), edges=effects, circuit=circuit,
        attribution=_attribution(estimator, estimates, effects, edges),
        heads=name_heads(circuit, summarise(model, sites, batches, 0, ranks=shard.ranks)["stats"]),
        notes=[patcher.wiring.mlp_note] if patcher.wiring.mlp_note else [],
        timing={"attribution_s": t_attr, "exact_s": t_exact, "total_s": time.perf_counter() - started,
                "forwards": sum(shard.ranks.gather(patcher.forwards)), "per_forward": patcher.per_forward,
                "micro_batch": plan.micro_batch, "ranks": shard.ranks.world})


def _chosen(edges: list[Edge], estimates: np.ndarray | None, top: int | None) -> list[Edge]:
    if estimates is None:
        return list(edges)
    k = min(len(edges), top or DEFAULT_TOP)
    return [edges[i] for i in np.argsort(-np.abs(estimates), kind="stable")[:k]]


def _circuit(patcher: Patcher, shard: Shard, parts, edges, effects, per_edge, prepared, nodes: Nodes,
             bar: Progress, *, target, resamples, n_boot, seed, units):
    def run(kept):
        m = shard.over_data(patcher, parts, removed_sets(kept, edges))
        return m.loss_sum, m.set_loss, m.diff, m.set_diff

    bar.stage("the minimal circuit and its stability")  # a search of unknown length: its passes move
    search = Search(run, per_edge.shape[0])
    order = [e.edge for e in effects]
    circuit, inclusion = minimal(search, order, per_edge, target, resamples=resamples, n_boot=n_boot, seed=seed)
    inside = frozenset(circuit.edges)
    without = search.losses([inside - {e} for e in circuit.edges] + [inside])
    for e in effects:
        e.inclusion = inclusion.get(e.edge)
        e.in_circuit = e.edge in inside
    for e, loss in zip([x for x in effects if x.in_circuit], without[:-1]):
        e.effect_in_circuit = float((loss - without[-1]).sum()) / units
        e.self_repair_gap = e.effect_in_circuit - e.delta_loss
    for p in prepared[1:]:
        bar.stage(f"the circuit under {p.method.name} ablation")
        nodes.use(p)
        other = Search(run, per_edge.shape[0])
        circuit.methods[p.method.name] = _holds(other, inside, target, n_boot, seed)
    nodes.use(prepared[0])
    return circuit


def _holds(search: Search, inside: frozenset, target: float, n_boot: int, seed: int) -> dict[str, Any]:
    from .minimal import _ci, faithfulness

    empty, kept = search.losses([frozenset(), inside])
    f = faithfulness(empty, kept, search.clean)
    held = {"faithfulness": f if np.isfinite(f) else None,
            "faithfulness_ci": _ci(empty, kept, search.clean, n_boot, seed), "holds": bool(np.isfinite(f) and f >= target)}
    if search.clean_diff is not None:
        held["faithfulness_logit_diff"], held["faithfulness_logit_diff_ci"] = search.logit_diff(
            frozenset(), inside, n_boot, seed)
    return held


def _attribution(estimator: str, estimates, effects, edges) -> dict[str, Any] | None:
    if estimates is None:
        return None
    rho = spearman([e.estimate for e in effects], [e.delta_loss for e in effects])
    ranked = np.argsort(-np.abs(estimates), kind="stable")[:DEFAULT_TOP]
    return {"estimator": estimator, "n_edges": len(edges), "n_verified": len(effects), "spearman_vs_exact": rho,
            "top": [{**edges[i].to_json(), "estimate": float(estimates[i])} for i in ranked]}

