"""Hugging Face TrainerCallback (extra: `transformers`): Trainer(..., callbacks=[DiagnoseHFCallback("runs/x")]).

Trap: the HF Trainer clips gradients before its last callback ahead of optimizer.step()
(`on_pre_optimizer_step`), so with max_grad_norm > 0 the norms logged here are post-clip;
run.json records this as settings.grad_norm_post_clip. Set max_grad_norm=0 (and clip in
your own code) to see the true pre-clip norm. The loss is the last micro-batch's
`outputs.loss`, read by a forward hook the callback owns and removes at the end.
"""

from __future__ import annotations

import os
from typing import Any

from ._monitor import TrainingMonitor


def _base():
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("DiagnoseHFCallback needs transformers: pip install 'diagnose[transformers]'") from None
    return TrainerCallback


class DiagnoseHFCallback(_base()):
    """Runs a TrainingMonitor inside the Hugging Face Trainer loop."""

    def __init__(self, run_dir: str | os.PathLike, **monitor_kwargs: Any):
        self.run_dir, self.kwargs = run_dir, monitor_kwargs
        self.monitor: TrainingMonitor | None = None
        self._loss = None
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # every rank runs a monitor (its step joins the cross-rank reduction); rank 0 writes
        post_clip = bool(args.max_grad_norm and args.max_grad_norm > 0)
        self.monitor = TrainingMonitor(model, self.run_dir, settings={"grad_norm_post_clip": post_clip}, **self.kwargs)

        def grab_loss(module, inputs, output):
            loss = getattr(output, "loss", None)
            if loss is not None and loss.requires_grad:
                self._loss = loss.detach()

        self._hook = model.register_forward_hook(grab_loss)

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self.monitor is not None:
            self.monitor.step(self._loss, optimizer=optimizer, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        try:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
        finally:
            if self.monitor is not None:
                self.monitor.close()
                self.monitor = None

