"""Initialisation and optimiser: the training recipe around a Transformer, checked from the objects.

check_training_setup(model, optimizer, scheduler, run_dir) runs what its arguments allow:
- init_std: std of the weight matrices against 0.02 (GPT-2/BERT). Only meaningful on a freshly
  initialised model -- training moves the weights -- so call it before the first step.
- residual_scaling: the projections that write into the residual stream (the last matrix of
  each sub-layer of a block whose output has d_model features: attention output, MLP down
  projection) initialised 1/sqrt(2 * n_layers) smaller than the others (GPT-2), so the residual
  stream's variance does not grow with depth. Fresh models only, like init_std.
- adam_beta2: beta2 = 0.999 (the PyTorch default) on a Transformer; 0.98 or 0.95 are the usual fix.
- warmup: the scheduler's lr over its first steps (simulated, then restored), or the lr column of
  a diagnose run folder: warmup means the first lr is below half the largest early lr.
- grad_clipping: from a run folder's run.json settings (TrainingMonitor(clip=...) records the max
  norm); nothing else records clipping, so without it the check is skipped.
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Any

import torch
import torch.nn as nn

from ._finding import Finding, Findings, SkipCheck

TARGET_STD = 0.02
STD_FACTOR = 2.0  # init_std flags a median weight std outside [0.02 / 2, 0.02 * 2]
BETA2_TOO_HIGH = 0.995
WARMUP_WINDOW = 100  # steps of schedule inspected
CHECKS = ("init_std", "residual_scaling", "adam_beta2", "warmup", "grad_clipping")


def _matrices(module: nn.Module) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """(name, module, weight) of every module with a 2-D `weight` (Linear, HF Conv1D, Embedding)."""
    return [(n, m, m.weight) for n, m in module.named_modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2]


def _out_features(m: nn.Module) -> int | None:
    if isinstance(getattr(m, "out_features", None), int):
        return m.out_features
    if isinstance(getattr(m, "nf", None), int):  # Hugging Face Conv1D: weight [in, out]
        return m.nf
    return None


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The layer stack: the longest ModuleList whose items are all of one class."""
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best) and len({type(x) for x in m}) == 1:
            best = list(m)
    return best


def _d_model(model: nn.Module) -> int | None:
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if emb is None else emb.embedding_dim


def check_init_std(model: nn.Module) -> list[Finding]:
    stds = [(n, float(w.detach().float().std())) for n, m, w in _matrices(model) if w.numel() > 1]
    if not stds:
        raise SkipCheck("the model has no weight matrices")
    values = [s for _, s in stds]
    median = statistics.median(values)
    if TARGET_STD / STD_FACTOR <= median <= TARGET_STD * STD_FACTOR:
        return []
    far = [n for n, s in stds if not TARGET_STD / STD_FACTOR <= s <= TARGET_STD * STD_FACTOR]
    return [Finding("init_std", "warning", f"Weight matrices start with std {median:.3g}, not {TARGET_STD}",
                    {"median_std": median, "min_std": min(values), "max_std": max(values),
                     "matrices": len(values), "matrices_outside_range": len(far), "target_std": TARGET_STD},
                    f"Initialise weight matrices and embeddings from N(0, {TARGET_STD}) (GPT-2, BERT): "
                    "for m in model.modules(): nn.init.normal_(m.weight, 0, 0.02) for Linear/Embedding, biases 0, "
                    "LayerNorm weight 1. (Only meaningful on a freshly initialised model.)")]


def check_residual_scaling(model: nn.Module) -> list[Finding]:
    blocks, d = _blocks(model), _d_model(model)
    if len(blocks) < 1 or d is None:
        raise SkipCheck("no layer stack (ModuleList of blocks) or token embedding found")
    residual, other = [], []
    for block in blocks:
        writers = set()
        for child in block.children():
            last = None
            for _, m, _w in _matrices(child):
                if _out_features(m) == d:
                    last = m
            if last is not None:
                writers.add(id(last))
        for _, m, w in _matrices(block):
            (residual if id(m) in writers else other).append(float(w.detach().float().std()))
    if not residual or not other:
        raise SkipCheck("could not tell the residual output projections from the other matrices")
    L = len(blocks)
    ratio = statistics.median(residual) / statistics.median(other)
    expected = 1 / math.sqrt(2 * L)
    if ratio <= (2 * L) ** -0.25:  # closer (in log) to 1/sqrt(2L) than to 1
        return []
    return [Finding("residual_scaling", "warning", "Residual output projections are not scaled down with depth",
                    {"n_layers": L, "residual_projection_std": statistics.median(residual),
                     "other_matrix_std": statistics.median(other), "ratio": ratio, "expected_ratio": expected,
                     "residual_projections": len(residual)},
                    f"Initialise the attention output and MLP down projections with std 0.02 / sqrt(2 * n_layers) "
                    f"(= {TARGET_STD * expected:.3g} here; GPT-2), so each of the 2 * n_layers residual additions "
                    "adds variance 1 / (2 * n_layers) and the stream does not grow with depth. (Fresh models only.)")]


def check_adam_beta2(optimizer: Any) -> list[Finding]:
    groups = [g for g in getattr(optimizer, "param_groups", []) if "betas" in g]
    if not groups:
        raise SkipCheck(f"{type(optimizer).__name__} has no Adam betas")
    beta2 = max(float(g["betas"][1]) for g in groups)
    if beta2 < BETA2_TOO_HIGH:
        return []
    return [Finding("adam_beta2", "warning", f"Adam beta2 = {beta2:g}: slow to follow changes in gradient scale",
                    {"beta2": beta2, "beta1": float(groups[0]["betas"][0]), "threshold": BETA2_TOO_HIGH},
                    "Use betas=(0.9, 0.98) (Vaswani et al. 2017) or (0.9, 0.95) (GPT-3, LLaMA): with 0.999 the "
                    "second-moment estimate remembers ~1000 steps, lags behind sudden gradient growth and lets "
                    "updates -- and the loss -- spike.")]


def _scheduled_lrs(optimizer: Any, scheduler: Any, n: int) -> list[float]:
    """The lr of group 0 at the scheduler's next n steps; scheduler and optimizer restored after."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise SkipCheck("ReduceLROnPlateau sets the lr from the loss: there is no schedule to read")
    if getattr(scheduler, "last_epoch", 0) > 0:
        raise SkipCheck(f"the scheduler has already stepped {scheduler.last_epoch} times; pass it before training")
    opt = optimizer if optimizer is not None else scheduler.optimizer
    saved_state, saved_lrs = scheduler.state_dict(), [g["lr"] for g in opt.param_groups]
    lrs = [float(opt.param_groups[0]["lr"])]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
            for _ in range(n - 1):
                scheduler.step()
                lrs.append(float(opt.param_groups[0]["lr"]))
    finally:
        scheduler.load_state_dict(saved_state)
        for g, lr in zip(opt.param_groups, saved_lrs):
            g["lr"] = lr
    return lrs


def _warmup_finding(steps: list[int], lrs: list[float], source: str) -> list[Finding]:
    lr0, peak = lrs[0], max(lrs)
    if lr0 < 0.5 * peak:
        return []
    return [Finding("warmup", "warning", "No learning-rate warmup: the first step already runs at the full lr",
                    {"lr_first_step": lr0, "lr_max_early": peak, "steps_inspected": steps[-1] - steps[0] + 1,
                     "source_is_run_folder": source == "run"},
                    "Warm the lr up linearly from ~0 over the first few hundred to few thousand steps "
                    "(e.g. LambdaLR(opt, lambda s: min(1, (s + 1) / warmup))): early Adam updates are large and "
                    "noisy, and Post-LN Transformers in particular diverge without warmup (Xiong et al. 2020).")]


def _run_info(run_dir: Any) -> tuple[Any, dict[str, Any]]:
    from ..monitor import read_run

    run = read_run(run_dir)
    settings = dict(run.info.get("settings") or {})
    for session in run.info.get("sessions") or []:
        settings.update(session.get("settings") or {})
    return run, settings


def check_training_setup(model: nn.Module | None = None, optimizer: Any = None, scheduler: Any = None,
                         run_dir: Any = None, *, checks: Any = None) -> Findings:
    """Check init (fresh model), Adam beta2, warmup and clipping from whatever is given.

    run_dir: a diagnose run folder (TrainingMonitor) for the lr column and the clip setting.
    checks: a subset of CHECKS (default all). Each check that its inputs do not allow is listed in
    .skipped with why. Returns Findings (a list of Finding with .passed, .skipped, .to_json()).
    """
    from ..errors import ConfigError

    names = list(CHECKS if checks is None else checks)
    if any(n not in CHECKS for n in names):
        raise ConfigError(f"unknown training-setup check(s) {', '.join(n for n in names if n not in CHECKS)}; "
                          f"choose from {', '.join(CHECKS)}")
    result = Findings(model={"family": type(model).__name__} if model is not None else {})
    run, settings = _run_info(run_dir) if run_dir is not None else (None, {})
    runs: dict[str, Any] = {}
    runs["init_std"] = (lambda: check_init_std(model)) if model is not None else "no model given"
    runs["residual_scaling"] = (lambda: check_residual_scaling(model)) if model is not None else "no model given"
    runs["adam_beta2"] = (lambda: check_adam_beta2(optimizer)) if optimizer is not None else "no optimizer given"
    if scheduler is not None:
        runs["warmup"] = lambda: _warmup_finding(list(range(WARMUP_WINDOW)),
                                                 _scheduled_lrs(optimizer, scheduler, WARMUP_WINDOW), "scheduler")
    elif run is not None:
        runs["warmup"] = lambda: _warmup_from_run(run)
    else:
        runs["warmup"] = "no scheduler or run folder to read the lr schedule from"
    if run is None:
        runs["grad_clipping"] = "no run folder given (clipping is read from its run.json settings)"
    else:
        runs["grad_clipping"] = lambda: _clipping(settings)
    for name in names:
        job = runs[name]
        if isinstance(job, str):
            result.skipped.append({"check": name, "why": job})
            continue
        try:
            found = job()
        except SkipCheck as why:
            result.skipped.append({"check": name, "why": str(why)})
            continue
        result.extend(found)
        if not any(f.is_problem for f in found):
            result.passed.append(name)
    return result


def _warmup_from_run(run: Any) -> list[Finding]:
    steps = run.steps
    if "lr" not in steps.columns:
        raise SkipCheck("the run folder records no lr (pass optimizer= or lr= to monitor.step)")
    rows = steps[["step", "lr"]].dropna().sort_values("step")
    if len(rows) < 2:
        raise SkipCheck("the run folder records the lr at fewer than 2 steps")
    first = int(rows["step"].iloc[0])
    early = rows[rows["step"] < first + WARMUP_WINDOW]
    if len(early) < 2:
        early = rows.iloc[:2]
    return _warmup_finding([int(s) for s in early["step"]], [float(v) for v in early["lr"]], "run")


def _clipping(settings: dict[str, Any]) -> list[Finding]:
    clip = settings.get("clip")
    if clip is None:
        raise SkipCheck("run.json records no clipping setting (TrainingMonitor(clip=max_norm) records it); "
                        "whether the loop clips is unknown")
    if isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0:
        return []
    return [Finding("grad_clipping", "warning", "No gradient clipping", {"clip": clip},
                    "Clip the global gradient norm before optimizer.step(): "
                    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).")]
