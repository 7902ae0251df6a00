"""Hugging Face TrainerCallback (extra: `transformers`): Trainer(..., callbacks=[DiagnoseHFCallback("runs/x")]).

What it logs, and how it matches the Trainer's own logs (logging_steps=1):
- step: the Trainer's global step after the optimizer step (the first step is 1, as in its logs).
- loss: the optimizer step's loss over all its micro-batches, as the Trainer reports it: the sum
  of the micro-batches' `outputs.loss` when the model normalised them by the step's token count
  (`num_items_in_batch`), else their mean. Read by a forward hook the callback owns; a custom
  `compute_loss` / `compute_loss_func` is not seen (the model's own loss is logged).
- grad_norm: PRE-clip. The Trainer clips before the last callback ahead of optimizer.step(), so
  the norms are read at the end of each backward (an autograd end-of-backward callback, queued
  after DDP's gradient averaging) and the last one is logged; `clip` in run.json is
  args.max_grad_norm (null when 0 / None) and clip_coef is logged.
- tokens: the attention mask's sum (else input_ids' size) over the step's micro-batches.
- evaluations: the Trainer's eval metrics go to evals.jsonl (`eval_loss` as loss, the rest
  without their `eval_` prefix).
stop_on=("nonfinite",) ends training (control.should_training_stop) when such an alert fires;
other keyword arguments go to TrainingMonitor (every, attention_every, raise_on, save_spikes, ...).
With save_spikes=True the step's batch (input_ids, attention_mask, labels, ..., micro-batches
joined) is saved, with per-example losses when the model declares a causal or masked LM loss.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from typing import Any, Iterable

import torch
import torch.nn.functional as F

from ._actions import note
from ._config import MonitorConfig
from ._monitor import TrainingMonitor
from ._signals import at_end_of_backward
from ._evals import log_trainer_eval
from ._spikes import join_micro_batches


def _base():
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("DiagnoseHFCallback needs transformers: pip install 'diagnose[transformers]'") from None
    return TrainerCallback


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    values = output.values() if hasattr(output, "values") else output if isinstance(output, (tuple, list)) else [output]
    return next((v for v in values if isinstance(v, torch.Tensor) and v.requires_grad), None)


def _per_example(logits: Any, labels: Any, shift: int) -> torch.Tensor | None:
    """Each example's mean token cross-entropy [B], as the model's ForCausalLM (shift 1) or
    ForMaskedLM (shift 0) loss computes it (labels -100 ignored); no graph, no sync."""
    if not (isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor)) or logits.dim() != 3:
        return None
    if labels.shape != logits.shape[:2]:
        return None
    with torch.no_grad():
        if shift:
            labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
        tok = F.cross_entropy(logits.float().transpose(1, 2), labels.to(logits.device), ignore_index=-100,
                              reduction="none")  # [B, T]
        return tok.sum(1) / (labels != -100).sum(1).clamp(min=1)


def _tracker_sinks(args: Any) -> list:
    """Live sinks for the trackers the Trainer reports to (args.report_to): the wandb run and the
    MLflow run its own callbacks opened, and TensorBoard next to its logs (TENSORBOARD_LOGGING_DIR
    or output_dir/runs, in a run folder named `diagnose`). A tracker whose sink cannot be made (no
    wandb run open, its package missing) is said once, by name, and left out: training goes on."""
    from ..errors import DiagnoseError
    from ._live_trackers import MLflowSink, TensorBoardSink, WandbSink

    report = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    root = getattr(args, "logging_dir", None) or os.getenv("TENSORBOARD_LOGGING_DIR") or \
        os.path.join(args.output_dir, "runs")
    makers = {"wandb": WandbSink, "mlflow": MLflowSink,
              "tensorboard": lambda: TensorBoardSink(os.path.join(root, "diagnose"))}
    sinks: list = []
    for name in (n for n in makers if n in report):
        try:
            sinks.append(makers[name]())
        except DiagnoseError as exc:
            warnings.warn(f"diagnose: DiagnoseHFCallback(trackers=True) streams nothing to {name} ({exc}); "
                          f"training and the run folder go on", RuntimeWarning, stacklevel=3)
    if not sinks and not any(n in report for n in makers):
        warnings.warn(f"diagnose: DiagnoseHFCallback(trackers=True), but args.report_to ({report}) names none of "
                      f"wandb, mlflow, tensorboard: nothing is streamed; fix: add one to report_to, or drop "
                      f"trackers=True", RuntimeWarning, stacklevel=3)
    return sinks


class DiagnoseHFCallback(_base()):
    """Runs a TrainingMonitor inside the Hugging Face Trainer loop. trackers=True also streams
    diagnose's scalars, under `diagnose/`, into the trackers of args.report_to (wandb, MLflow,
    TensorBoard); config= (a MonitorConfig) and other keyword arguments (sinks= among them) are
    TrainingMonitor's settings."""

    def __init__(self, run_dir: str | os.PathLike, *, stop_on: Iterable[str] = (), trackers: bool = False,
                 config: MonitorConfig | None = None, **monitor_kwargs: Any):
        self.run_dir, self.trackers = run_dir, trackers
        self.config = MonitorConfig.of(config, monitor_kwargs, caller="DiagnoseHFCallback")  # checked before training
        # stop_on ends the trainer's loop (no exception), and writes the step to skips.json as the monitor's would
        self.stop_on = frozenset((stop_on,) if isinstance(stop_on, str) else stop_on) | self.config.stop_on
        self.config = replace(self.config, stop_on=())
        self.monitor: TrainingMonitor | None = None
        self._hooks: list = []
        self._scaler = None
        self._new_step()

    def _new_step(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._share = False  # the model divided its loss by the step's token count
        self._tokens: torch.Tensor | None = None
        self._batches: list[dict[str, torch.Tensor]] = []
        self._per_example: list[torch.Tensor] = []
        self._logging = False

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        # every rank runs a monitor (its step joins the cross-rank reduction); rank 0 writes
        config = self.config.with_trainer(
            clip=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None,
            settings={"grad_norm_post_clip": False, "integration": "hf"},
            sinks=_tracker_sinks(args) if self.trackers and state.is_world_process_zero else [])
        self.monitor = TrainingMonitor(model, self.run_dir, config=config)
        self._scaler = getattr(optimizer, "scaler", None)  # accelerate's GradScaler (fp16), else None
        # the model's own declared loss: next-token (shifted) or masked-token cross-entropy
        loss_fn = getattr(getattr(model, "loss_function", None), "__name__", None)
        self._shift = {"ForCausalLMLoss": 1, "ForMaskedLMLoss": 0}.get(loss_fn)
        self._world = max(1, int(getattr(args, "world_size", 1) or 1))
        self._avg_tokens = bool(getattr(args, "average_tokens_across_devices", False))
        # hooks on the whole model run outside its compiled forward (Trainer's torch_compile): dynamo
        # traced them as a graph of their own (token count, per-example loss), so they run eagerly
        self._hooks = [model.register_forward_pre_hook(torch.compiler.disable(self._pre), with_kwargs=True),
                       model.register_forward_hook(torch.compiler.disable(self._post))]
        self.monitor._expect(state.global_step + 1)
        self._new_step()

    def _pre(self, module, args, kwargs):
        if not torch.is_grad_enabled() or not self._logging:
            return
        if kwargs.get("num_items_in_batch") is not None:
            self._share = True
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
        count = mask.sum() if isinstance(mask, torch.Tensor) else ids.numel() if isinstance(ids, torch.Tensor) else None
        if count is not None:
            self._tokens = count if self._tokens is None else self._tokens + count
        if self.monitor is not None and self.monitor.save_spikes:
            self._batches.append({k: v.detach() for k, v in kwargs.items()
                                  if isinstance(v, torch.Tensor) and v.dim() >= 1})

    def _post(self, module, args, output):
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            self._losses.append(loss.detach())
            if self._batches and self._shift is not None:
                per = _per_example(getattr(output, "logits", None), self._batches[-1].get("labels"), self._shift)
                if per is not None:
                    self._per_example.append(per)
        anchor = _first_grad_tensor(output)
        if anchor is not None and self._logging:
            anchor.register_hook(self._on_backward)

    def _on_backward(self, grad):
        at_end_of_backward(self._capture)  # after DDP's averaging: final and pre-clip

    def _capture(self) -> None:
        if self.monitor is not None:
            self.monitor._capture_grads(self._scaler)

    def on_step_begin(self, args, state, control, **kwargs):
        self._new_step()
        # every step, logged or not: its loss, pre-clip grad norm and batch are the every-step detectors' inputs
        self._logging = self.monitor is not None

    def _step_loss(self) -> torch.Tensor | None:
        if not self._losses:
            return None
        losses = torch.stack([x.float().reshape(()) for x in self._losses])
        if not self._share:
            return losses.mean()
        total = losses.sum()
        # the Trainer multiplies each rank's share by the world size when it averages tokens
        # across devices; the monitor averages over ranks, so multiply here as it does
        return total * self._world if self._avg_tokens and self._world > 1 else total

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self.monitor is None:
            return
        batch = join_micro_batches(self._batches) if self._batches else None
        per = None
        if self._per_example and len(self._per_example) == len(self._batches):
            per = torch.cat(self._per_example)
        n = len(self._losses) or None
        try:
            self.monitor.step(self._step_loss(), optimizer=optimizer, step=state.global_step + 1, micro_batches=n,
                              tokens=self._tokens, batch=batch, per_example_loss=per)
        except BaseException:  # raise_on fired (or worse): the Trainer has no exception hook, so clean up here
            self.on_train_end(args, state, control)
            raise
        stop = {a["kind"] for a in self.monitor.last_alerts} & self.stop_on
        if stop:
            note(self.monitor, self.monitor.last_alerts[0]["step"], stop, "stopped")
            control.should_training_stop = True
        self._new_step()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.monitor is None or not metrics:
            return
        numbers = {(k[5:] if k.startswith("eval_") else k): v for k, v in metrics.items()
                   if k not in ("eval_loss", "epoch")}  # any name, `eval_step` and `eval_self` too
        log_trainer_eval(self.monitor, state.global_step, metrics.get("eval_loss"), numbers)

    def on_train_end(self, args, state, control, **kwargs):
        try:
            for h in self._hooks:
                h.remove()
            self._hooks = []
        finally:
            if self.monitor is not None:
                self.monitor.close()
                self.monitor = None
