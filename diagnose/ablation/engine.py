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
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..adapters.base import AttentionSite
from ..adapters.shared import shared_modules
from ..errors import ConfigError
from ..modes import eval_mode
from ..objectives import TASKS
from ..sites import find_heads
from . import contrast, roles, significance
from .batches import as_batches
from .gate import METHODS, gated
from .together import ablate_together
from .attention import summarise
from .result import ATTENTION_STATS, HeadEffect, HeadsResult
from .sweep import Sweep

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
                 min_effect: float = MIN_EFFECT, rank_by: str = FAST_RANK) -> HeadsResult:
    """Ablate every head (or, with fast=True, the `top` heads by gradient importance) and test each effect.

    data: a DataSet / TaskData / dict with input_ids (cut into batch_size batches) or an iterable of
    (inputs, labels) pairs. progress: True for a bar on stderr, or a callable(done, total).
    attention: also summarise each head's attention (keeping `keep` examples' maps for the report).
    reuse: replay the unchanged blocks below each ablated layer (off only to measure its worth).
    tokens: token strings per example for the kept maps (default: data.tokens, else the ids).
    correction: "holm" (default) or "bh" across the heads tested. min_effect: the negligible band for
    `striking_but_inert`, as a fraction of the baseline loss. rank_by: the --fast estimate.
    """
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if correction not in significance.CORRECTIONS:
        raise ConfigError(f"correction {correction!r} is not one of {', '.join(significance.CORRECTIONS)}")
    if not (min_effect >= 0):
        raise ConfigError(f"min_effect must be 0 or more (a fraction of the baseline loss), got {min_effect}")
    if rank_by not in RANKINGS:
        raise ConfigError(f"rank_by {rank_by!r} is not one of {', '.join(RANKINGS)}")
    if top is not None and int(top) < 0:
        raise ConfigError(f"top must be 0 or more, got {top}")
    started = time.perf_counter()
    device = next((p.device for p in model.parameters()), None)
    batches = as_batches(data, batch_size, device)
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    n_total = sum(s.n_heads for s in sites)
    n_top = n_total if not fast else min(n_total, DEFAULT_TOP if top is None else int(top))

    with eval_mode(model), _progress(progress) as bar, gated(sites) as gates:
        sweep = Sweep(model, sites, gates, task, reuse=reuse)
        bar.total(len(batches) * ((method == "mean") + (1 if fast else len(sites)) + (fast and n_top > 0)))
        if method == "mean":
            for gate, fill in zip(gates, sweep.mean_outputs(batches, bar.tick)):
                gate.fill = fill
        acc = _Accumulator(len(sweep.heads))
        if not fast:
            for inputs, labels in batches:
                clean = sweep.clean(inputs, labels, grad=True, record=True)
                acc.add_clean(clean)
                acc.add_ablated(sweep.ablate(clean, range(n_total), bar.tick))
            chosen = list(range(n_total))
        else:
            kept: list | None = []  # the clean batches, kept for the verification while they fit KEEP_BYTES
            for inputs, labels in batches:
                clean = sweep.clean(inputs, labels, grad=True, record=n_top > 0)
                acc.add_clean(clean)
                if kept is not None:
                    kept.append(clean)
                    if sum(c.nbytes() for c in kept) > KEEP_BYTES:
                        kept = None  # too big: the verification recomputes each clean pass instead
                bar.tick()
            ranking_seconds = time.perf_counter() - started
            chosen = list(np.argsort(-acc.fast_score(rank_by), kind="stable")[:n_top])
            for i, (inputs, labels) in enumerate(batches if chosen else []):
                clean = kept[i] if kept is not None else sweep.clean(inputs, labels, grad=False, record=True)
                acc.add_ablated(sweep.ablate(clean, chosen), i)
                bar.tick()
    ablation_seconds = time.perf_counter() - started
    if attention:
        with eval_mode(model):
            summary = summarise(model, sites, batches, keep, tokens if tokens is not None
                                else getattr(data, "tokens", None))
    else:
        summary = None
    heads = _heads(acc, sweep, chosen, alpha, n_boot, seed, summary, correction)
    n_sig = sum(bool(h.significant) for h in heads)
    baseline = {"accuracy": acc.clean_accuracy(), "loss": acc.clean_loss()}
    band = contrast.default_band(baseline["loss"], min_effect)
    for h in heads:
        h.negligible = contrast.negligible(h, band) if h.verified else None
    roles.assign(heads)
    fast_info = None
    if fast:
        verified = [h for h in heads if h.verified]
        fast_info = {"top": n_top, "ranked_by": rank_by, "seconds_ranking": ranking_seconds,
                     "spearman_vs_exact": contrast.spearman([getattr(h, rank_by) for h in verified],
                                                            [h.delta_loss for h in verified])}
    correlations = contrast.correlations([h for h in heads if h.verified])
    correlations["fast_vs_exact"] = contrast.spearman(
        [getattr(h, rank_by) for h in heads if h.verified], [h.delta_loss for h in heads if h.verified])
    flags = _flags_with_groups(heads, model, batches, task, method, sites, baseline, band)
    family = sites[0].adapter.family if sites else "unknown"
    n_heads = sorted({s.n_heads for s in sites})
    model_info = {"family": family, "n_layers": len(sites), "n_heads": n_heads[0] if len(n_heads) == 1 else
                  [s.n_heads for s in sites], "class": type(model).__name__}
    shared = shared_modules(sites)
    if shared:  # one layer applied at several depths (ALBERT): each application is its own site
        model_info["shared"] = shared
    return HeadsResult(
        model=model_info,
        task=task, method=method, n_examples=acc.n_examples, n_units=int(acc.units()), baseline=baseline,
        heads=heads, correlations=correlations, flags=flags,
        timing={"seconds": time.perf_counter() - started, "ablation_seconds": ablation_seconds,
                "forward_passes": sweep.forwards, "examples_forwarded": sweep.examples_forwarded,
                "prefix_reuse": sweep.reuse, "batches": len(batches)},
        significance=_significance_info(heads, len(chosen), acc.n_examples, alpha, correction, n_boot, seed, band),
        fast=fast_info, examples=summary["examples"] if summary else [])


class _Accumulator:
    """Per-example sums over the whole data set: clean, and per head ablated."""

    def __init__(self, n_heads: int):
        self.n_heads = n_heads
        self.loss_sum, self.correct, self.count = [], [], []
        self.ab_loss, self.ab_correct = [], []  # lists of [B, M] arrays (NaN: head not ablated)
        self.kl = np.zeros(n_heads)
        self.michel = np.zeros(n_heads)  # sum over examples of |d L_b / d xi_h|, L_b the example's mean loss
        self.linear = np.zeros(n_heads)  # sum over examples of d loss_sum_b / d xi_h
        self.fisher = np.zeros(n_heads)  # sum over examples of (d loss_sum_b / d xi_h) ** 2 / units_b
        self.n_scored_examples = 0

    def add_clean(self, clean) -> None:
        self.loss_sum.append(clean.loss_sum.double().cpu().numpy())
        self.correct.append(clean.correct.double().cpu().numpy())
        count = clean.count.double().cpu().numpy()
        self.count.append(count)
        if clean.grads is not None:
            g = torch.cat(clean.grads, dim=1).double().cpu().numpy()  # [B, M]
            scored = count > 0
            self.michel += (np.abs(g[scored]) / count[scored, None]).sum(0)
            self.linear += g.sum(0)
            self.fisher += (g[scored] ** 2 / count[scored, None]).sum(0)
            self.n_scored_examples += int(scored.sum())

    def add_ablated(self, ablated: dict, batch_index: int | None = None) -> None:
        B = self.loss_sum[-1 if batch_index is None else batch_index].shape[0]
        loss, correct = np.full((B, self.n_heads), np.nan), np.full((B, self.n_heads), np.nan)
        for m, a in ablated.items():
            loss[:, m] = a.loss_sum.double().cpu().numpy()
            correct[:, m] = a.correct.double().cpu().numpy()
            self.kl[m] += a.kl_sum
        self.ab_loss.append(loss)
        self.ab_correct.append(correct)

    @property
    def n_examples(self) -> int:
        return int(sum(len(x) for x in self.count))

    def arrays(self):
        cat = np.concatenate
        loss_sum, correct, count = cat(self.loss_sum), cat(self.correct), cat(self.count)
        if not self.ab_loss:  # fast mode with nothing to verify
            empty = np.full((len(count), self.n_heads), np.nan)
            return loss_sum, correct, count, empty, empty
        return loss_sum, correct, count, cat(self.ab_loss), cat(self.ab_correct)

    def units(self) -> float:
        return float(max(sum(float(c.sum()) for c in self.count), 1.0))

    def clean_accuracy(self) -> float:
        return sum(float(c.sum()) for c in self.correct) / self.units()

    def clean_loss(self) -> float:
        return sum(float(c.sum()) for c in self.loss_sum) / self.units()

    def grad_raw(self) -> np.ndarray:
        return self.michel / max(self.n_scored_examples, 1)

    def estimated_delta_loss(self) -> np.ndarray:
        return -self.linear / self.units()  # first order: L(xi = 0) - L(xi = 1) = -dL/dxi

    def second_order_delta_loss(self) -> np.ndarray:
        """Taylor to second order, L(0) - L(1) = -L' + L''/2, the curvature by the empirical Fisher
        (Gauss-Newton for cross-entropy: E (d loss_b / d xi) ** 2, per scored unit)."""
        return (-self.linear + 0.5 * self.fisher) / self.units()

    def fast_score(self, rank_by: str = FAST_RANK) -> np.ndarray:
        return {"estimated_delta_loss": self.estimated_delta_loss, "grad_importance_raw": self.grad_raw,
                "second_order_delta_loss": self.second_order_delta_loss}[rank_by]()


def _significance_info(heads: list[HeadEffect], n_tested: int, n_examples: int, alpha: float, correction: str,
                       n_boot: int, seed: int, band: dict) -> dict:
    """How `significant` was decided, and the smallest accuracy effect this much data can show."""
    k = significance.min_detectable_examples(n_tested, alpha)
    detectable = k / max(n_examples, 1)
    return {"test": significance.TEST, "loss_test": significance.LOSS_TEST, "drives": significance.DRIVES,
            "correction": correction, "alpha": alpha, "n_tested": n_tested,
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


def _heads(acc: _Accumulator, sweep: Sweep, chosen: list[int], alpha: float, n_boot: int, seed: int,
           summary: dict | None, correction: str = "holm") -> list[HeadEffect]:
    loss_sum, correct, count, ab_loss, ab_correct = acc.arrays()
    units = acc.units()
    idx = np.array(sorted(int(m) for m in chosen), dtype=int)
    d_correct = ab_correct[:, idx] - correct[:, None]  # [N, M_chosen]
    scored = count > 0
    diff_acc = d_correct[scored] / count[scored, None]
    p = significance.sign_test(diff_acc) if len(idx) else np.zeros(0)
    p_adj = significance.adjust(p, correction)
    ci = significance.bootstrap_ci(d_correct, count, n_boot=n_boot, seed=seed) if len(idx) else np.zeros((0, 2))
    d_loss = ab_loss[:, idx] - loss_sum[:, None]  # [N, M_chosen] summed over each example's units
    flips = significance.flips_needed(len(idx), alpha)
    p_loss = significance.sign_flip_test(significance.signed_ranks(d_loss[scored]), n_flips=flips,
                                         seed=seed) if len(idx) else np.zeros(0)
    p_loss_adj = significance.adjust(p_loss, correction)
    loss_ci = significance.bootstrap_ci(d_loss, count, n_boot=n_boot, seed=seed) if len(idx) else np.zeros((0, 2))
    raw = acc.grad_raw()
    est = acc.estimated_delta_loss()
    est2 = acc.second_order_delta_loss()
    norm = np.zeros_like(raw)
    for s in range(len(sweep.sites)):
        members = [m for m, (ss, _) in enumerate(sweep.heads) if ss == s]
        scale = float(np.linalg.norm(raw[members]))
        norm[members] = raw[members] / scale if scale > 0 else 0.0
    exact = {int(m): j for j, m in enumerate(idx)}
    base_acc, base_loss = float(correct.sum()) / units, float(loss_sum.sum()) / units
    heads = []
    for m, (s, h) in enumerate(sweep.heads):
        stats = _stats_for(summary, s, h)
        if m in exact:
            j = exact[m]
            acc_m, loss_m = float(ab_correct[:, m].sum()) / units, float(ab_loss[:, m].sum()) / units
            heads.append(HeadEffect(
                s, h, acc_m, acc_m - base_acc, [float(ci[j, 0]), float(ci[j, 1])], float(p[j]), float(p_adj[j]),
                bool(p_loss_adj[j] < alpha), loss_m, loss_m - base_loss, float(acc.kl[m]) / units, float(norm[m]),
                float(raw[m]), float(est[m]), True, stats, [float(loss_ci[j, 0]), float(loss_ci[j, 1])],
                float(p_loss[j]), float(p_loss_adj[j]), second_order_delta_loss=float(est2[m])))
        else:
            heads.append(HeadEffect(s, h, None, None, None, None, None, None, None, None, None, float(norm[m]),
                                    float(raw[m]), float(est[m]), False, stats,
                                    second_order_delta_loss=float(est2[m])))
    return heads


def _flags_with_groups(heads: list[HeadEffect], model: torch.nn.Module, batches: list, task: str, method: str,
                       sites: Sequence[AttentionSite], baseline: dict[str, float], band: dict) -> list[dict]:
    """The contrast flags, with look-alike heads closed together (one forward per batch and group)
    where that can change the story: a striking-but-inert member may be a backup, and heads that each
    barely matter alone may carry the answer together."""
    by_head = {(h.layer, h.head): h for h in heads}
    flags = contrast.flags(heads, baseline["loss"], band)
    inert = {(f["layer"], f["head"]) for f in flags if f["kind"] == "striking_but_inert"}
    effects: dict[tuple, dict] = {}

    def closed_together(members: tuple) -> dict:
        if members not in effects:
            effects[members] = ablate_together(model, batches, list(members), task=task, method=method, sites=sites,
                                               baseline=(baseline["accuracy"], baseline["loss"])).to_json()
        return effects[members]

    out = []
    for f in flags:
        if f.get("twins"):
            members = tuple(sorted([(f["layer"], f["head"]), *(tuple(t) for t in f["twins"])]))
            singles = [by_head[m].delta_accuracy for m in members]
            f = contrast.backup_test(f, closed_together(members), None if None in singles else sum(singles))
        out.append(f)
    for role, members in contrast.look_alikes(heads):
        small = all(by_head[m].verified and abs(by_head[m].delta_accuracy) < contrast.VITAL_ACCURACY
                    for m in members)
        if small and not inert & set(members):  # inert members' flags already carry the group's effect
            group_flag = contrast.redundant_flag(role, members, by_head, closed_together(tuple(members)))
            if group_flag is not None:
                out.append(group_flag)
    return contrast.rank(out)


def _stats_for(summary: dict | None, s: int, h: int) -> dict[str, float | None]:
    if not summary:
        return {k: None for k in ATTENTION_STATS}
    per_site = summary["stats"][s]
    return {k: (None if per_site.get(k) is None else float(per_site[k][h])) for k in ATTENTION_STATS}


class _Bar:
    def __init__(self, on_step: Callable[[int, int], None] | None):
        self.on_step, self.done, self.n = on_step, 0, 0

    def total(self, n: int) -> None:
        self.n = n

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

    with Progress(TextColumn("ablating heads"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("heads", total=None)
        yield _Bar(lambda done, n: bar.update(task, completed=done, total=n))
