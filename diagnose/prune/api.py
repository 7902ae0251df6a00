"""prune_heads: remove the heads a model can do without, and prove the smaller model is the same.

The steps: choose (choose.py, all through the head gate), cut (cut.py, on a copy), verify
(verify.py: outputs equal to the gated original's, held-out figures, size and speed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch.nn as nn

from .._tolerance import model_size
from ..ablation import AblationConfig
from ..ablation.batches import as_batches, for_last_position
from ..ablation.config import PRUNE
from ..ablation.gate import gated
from ..ablation.methods import FOLDABLE, DataPass, get_method, install, prepare
from ..adapters.base import AttentionSite
from ..adapters.layout import layout_of
from ..errors import ConfigError, DataError, DiagnoseError
from ..modes import eval_mode
from ..objectives import TASKS, default_task
from ..sites import find_heads
from . import verify
from ._measure import Measure
from .choose import Budget, Choice, Step, choose
from .cut import check_cuttable, cut, family_of, min_heads
from .result import (Change, CurvePoint, Figures, ModelInfo, PruneResult, Removal, Settings, Size, Stop, Timing,
                     Verification)

DEFAULT_MAX_DROP = 1.0  # accuracy points, classification
DEFAULT_MAX_LOSS = 0.05  # nats per scored token, language models
CANDIDATES = 4


def prune_heads(model: nn.Module, data: Any, *, config: AblationConfig | None = None, max_drop: float | None = None,
                max_loss: float | None = None, eval_data: Any = None, candidates: int = CANDIDATES,
                limit: int | None = None, sites: Sequence[AttentionSite] | None = None,
                on_step: Callable[[Step, Choice], None] | None = None, time_repeats: int = 7,
                **options: Any) -> PruneResult:
    """Remove heads one at a time while the model stays within budget on `data`; return the pruned copy.

    config: the AblationConfig of ablate_heads, of which this reads task, method (a foldable one) and
    batch_size; those three are also keywords, laid over `config` (without either, the task is the
    model's and the data's: objectives.default_task). max_drop: accuracy points (of 100) the model may
    lose on `data` (classification default 1.0);
    max_loss: mean loss it may gain (language models default 0.05 nats per token). Each round
    verifies `candidates` heads exactly (see choose.py). eval_data: held-out data for the before/after
    figures (choosing on `data` flatters it). limit: at most this many removals. The input model is
    never modified; `result.model` is a pruned copy; `result.save_pretrained(dir)` writes it and
    `result.save(path)` the JSON.
    """
    started = time.perf_counter()
    cfg = _config(model, data, config, options)
    task, method, batch_size = cfg.task, cfg.method, cfg.batch_size
    budget = _budget(task, max_drop, max_loss)
    how = get_method(method)
    if not how.foldable:
        raise ConfigError(f"method {method!r} cannot be folded into the weights, so a pruned model cannot "
                          f"reproduce it; prune with {', '.join(FOLDABLE)}")
    if int(candidates) < 1 or (limit is not None and int(limit) < 0):
        raise ConfigError("candidates must be at least 1 and limit 0 or more")
    batches, held_out = _batches(model, data, eval_data, task, batch_size)
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    layouts = check_cuttable(model, sites, method)
    with eval_mode(model):
        measure = Measure(model, sites, batches, task)
        with gated(sites) as gates:
            fills = prepare(how, DataPass(measure.sweep(gates, []), measure.parts))  # foldable: [H, D] or None per site
            choice = choose(measure, gates, budget, candidates=candidates, min_heads=min_heads(layouts),
                            limit=limit, on_step=on_step)
        pruned = cut(model, sites, choice.removed(), fills)  # outside the gates: a copy must not inherit them
        pruned.model.eval()
        with gated(sites) as gates:
            install(how, fills, gates)
            try:
                checked = verify.compare(measure, gates, choice.removed(), pruned.model, *model_size(sites))
            except (RuntimeError, ValueError) as exc:
                raise ConfigError(f"{type(model).__name__}: the pruned copy does not run ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}); its attention must size its "
                                  "reshapes from the head count, not the embedding width") from None
            before = measure.per_example(measure.sweep(gates, []))
            after = measure.per_example(measure.sweep(gates, choice.removed()))
            forwards = measure.forwards
    if not checked["passed"]:
        raise DiagnoseError(f"{type(model).__name__}: the pruned model's outputs differ from the gated model's by "
                            f"{checked['max_abs_diff']:.3g} (tolerance {checked['tolerance']:.3g}); nothing was "
                            "saved: please report this with the model's family")
    settings = Settings(budget.max_drop, budget.max_loss, int(candidates), limit)
    return _result(_Pruned(model=model, pruned=pruned, sites=sites, config=cfg, settings=settings, choice=choice,
                           checked=checked, before=before, after=after, held_out=held_out, batches=batches,
                           started=started, forwards=forwards, time_repeats=time_repeats))


def _config(model: nn.Module, data: Any, config: AblationConfig | None, options: dict[str, Any]) -> AblationConfig:
    """The one place prune_heads' keywords become its AblationConfig (a keyword left at None keeps the config's
    or the default; no task anywhere: the model's and the data's)."""
    given = {k: v for k, v in options.items() if not (k in PRUNE and v is None)}
    defaults = {} if config is not None or "task" in given else {"task": default_task(model, data)}
    return AblationConfig.of(config, given, caller="prune_heads", options=PRUNE, **defaults)


@dataclass(frozen=True)
class _Pruned:
    """What prune_heads measured, for _result: the models, the config, the choice and the checks on them."""

    model: nn.Module
    pruned: Any  # the cut.Cut
    sites: Sequence[AttentionSite]
    config: AblationConfig
    settings: Settings
    choice: Any  # choose.Choice
    checked: dict[str, Any]  # verify.compare
    before: Any  # per-example outcomes on `data`, gated model
    after: Any  # the same with the chosen heads closed
    held_out: Any  # the eval batches, or None
    batches: Any
    started: float
    forwards: int
    time_repeats: int


def _batches(model: nn.Module, data: Any, eval_data: Any, task: str, batch_size: int | None):
    """The data and the held-out data (or None) as batches on the model's device, scored as the task says."""
    device = next((p.device for p in model.parameters()), None)
    batches = for_last_position(model, as_batches(data, batch_size, device), task)
    held_out = for_last_position(model, as_batches(eval_data, batch_size, device), task) if eval_data is not None \
        else None
    for name, bs in (("data", batches), ("eval data", held_out or [])):
        if task == "classification" and any(labels is None for _, labels in bs):
            raise DataError(f"the {name} has no labels; classification pruning measures accuracy against them")
    return batches, held_out


def _budget(task: str, max_drop: float | None, max_loss: float | None) -> Budget:
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    for name, value in (("max_drop", max_drop), ("max_loss", max_loss)):
        if value is not None and not (float(value) >= 0):
            raise ConfigError(f"{name} must be 0 or more, got {value}")
    if max_drop is None and max_loss is None:
        return Budget(DEFAULT_MAX_DROP, None) if task == "classification" else Budget(None, DEFAULT_MAX_LOSS)
    return Budget(None if max_drop is None else float(max_drop), None if max_loss is None else float(max_loss))


def _result(run: _Pruned) -> PruneResult:
    model, pruned, sites, choice, held_out, task = run.model, run.pruned, run.sites, run.choice, run.held_out, \
        run.config.task
    total = sum(s.n_heads for s in sites)
    base = Figures(choice.baseline.accuracy, choice.baseline.loss)
    curve = [CurvePoint(0, 0.0, base.accuracy, base.loss)]
    curve += [CurvePoint(s.n_removed, s.n_removed / total, s.accuracy, s.loss, s.layer, s.head) for s in choice.steps]
    order = [Removal(s.layer, s.head, s.estimate, s.accuracy, s.loss) for s in choice.steps[:choice.kept]]
    last = choice.steps[choice.kept - 1] if choice.kept else base
    data_fig = Change(base, Figures(last.accuracy, last.loss), **verify.paired_noise(run.before, run.after),
                      note="the heads were chosen on this data, so its figures flatter the pruned model")
    eval_fig = None
    if held_out is not None:
        with eval_mode(model):
            b, a = verify.accuracy_and_loss(model, held_out, task), verify.accuracy_and_loss(pruned.model, held_out, task)
        eval_fig = Change(Figures(b["accuracy"], b["loss"]), Figures(a["accuracy"], a["loss"]),
                          **verify.paired_noise(b["per_example"], a["per_example"]),
                          n_examples=int(len(b["per_example"])))
    with eval_mode(model):
        speed = verify.forward_time(model, pruned.model, run.batches[0][0], run.time_repeats)
    size = Size(verify.n_parameters(model), verify.n_parameters(pruned.model), **speed)
    notes = list(dict.fromkeys(lay.min_heads_note for lay in map(layout_of, sites) if lay.min_heads_note))
    if any(n == 0 for n in pruned.heads_left):
        notes.append("layers left with no heads keep their output projection's bias: their attention output is "
                     "exactly that bias, as in the gated model")
    for layer, note in sorted(pruned.notes.items()):
        if note.get("padded"):
            notes.append(f"layer {layer}: the query groups left differ in size, so {note['padded']} empty query "
                         f"slot(s) (zero weights, adding exactly 0) pad them to {note['query_slots']} for "
                         f"{note['kv_heads']} key/value head(s): transformers needs equal groups")
    info = ModelInfo(family_of(sites), type(model).__name__, len(sites), [s.n_heads for s in sites],
                     getattr(model, "diagnose_format", None))
    return PruneResult(
        model=pruned.model, info=info, task=task, method=run.config.method, settings=run.settings,
        n_examples=int(len(run.before)),
        baseline=base, curve=curve, order=order, heads_left=pruned.heads_left, stop=Stop.from_choice(choice.stop),
        verify=Verification(**run.checked), data=data_fig, eval=eval_fig, size=size,
        timing=Timing(time.perf_counter() - run.started, choice.rounds, run.forwards), notes=notes, cut=pruned)
