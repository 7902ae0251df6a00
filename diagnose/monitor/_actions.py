"""Actions on alerts, opt-in: skip the optimizer step (skip_on) or stop the run (stop_on), and the
list of steps and batches either left out, written to the run folder as skips.json.

    skips.json  {"format": "diagnose.skips/1", "steps": [{"step", "kinds", "action", "batch"}]}

action: "skipped" (the optimizer step was dropped), "stopped" (the run was stopped there: skip
that batch when resuming) or "not_skipped" (asked for, but impossible: the reason is in `why`).
batch: the spikes/ file stem of the saved batch, or null when none was saved
(TrainingMonitor(save_spikes=True) and step(batch=...) save it). The file is strict JSON, written
whole and renamed into place at every entry, and a resumed run appends to it.

How a step is skipped: TrainingMonitor.step() runs after backward and before optimizer.step(),
so it drops the gradients (sets every parameter's .grad to None). torch's optimizers, and
Lightning's and the Hugging Face Trainer's calls of them, skip a parameter whose gradient is
None: no update, no weight decay, and the optimizer's state (Adam's moments and step count)
untouched, as OLMo-core's SkipStepAdamW leaves it. The lr scheduler still steps.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Iterable

import torch.nn as nn

from .. import _json
from .._write import atomic_write
from ..errors import RunFolderError
from ..io import read_json

SKIPS, SKIPS_FORMAT = "skips.json", "diagnose.skips/1"
ACTIONS = ("skipped", "stopped", "not_skipped")

_SCALER = ("the step was not skipped: a GradScaler's gradients must be unscaled first "
           "(scaler.unscale_(optimizer) before monitor.step(), the usual recipe before clipping); "
           "without it scaler.step() finds no gradient to check")


def read_skips(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The entries of RUN/skips.json in order ([] when there is none); RunFolderError naming the file
    and the field for one that is not a diagnose.skips/1 file."""
    path = Path(run_dir) / SKIPS
    if not path.exists():
        return []
    data = read_json(path, SKIPS, "delete it or write it again (TrainingMonitor(skip_on=, stop_on=) writes it)",
                     limit=64 << 20)
    if not isinstance(data, dict) or data.get("format") != SKIPS_FORMAT or not isinstance(data.get("steps"), list):
        raise RunFolderError(f"{path} is not a {SKIPS_FORMAT} file; delete it or write it again")
    for i, e in enumerate(data["steps"]):
        if not (isinstance(e, dict) and isinstance(e.get("step"), int) and e.get("action") in ACTIONS
                and isinstance(e.get("kinds"), list)):
            raise RunFolderError(f"{path}: entry {i} needs an integer step, a list of kinds and an action "
                                 f"in {ACTIONS}; delete the file or fix that entry")
    return data["steps"]


class SkipList:
    """The run's skips.json, kept in memory and rewritten whole at each entry (rare: one per spike).
    run_dir None (no run folder, or a rank other than 0): the entries are kept, nothing written."""

    def __init__(self, run_dir: str | os.PathLike | None):
        self.path = Path(run_dir) / SKIPS if run_dir is not None else None
        self.steps: list[dict[str, Any]] | None = None  # read at the first entry: a resumed run appends

    def add(self, step: int, kinds: Iterable[str], action: str, batch: str | None, why: str | None = None) -> None:
        if self.steps is None:
            self.steps = read_skips(self.path.parent) if self.path is not None else []
        entry: dict[str, Any] = {"step": int(step), "kinds": sorted(kinds), "action": action, "batch": batch}
        if why:
            entry["why"] = why
        self.steps.append(entry)
        if self.path is not None:
            atomic_write(self.path, _json.dumps({"format": SKIPS_FORMAT, "steps": self.steps}, indent=1) + "\n",
                         what=SKIPS)


def unscaled(scaler: Any, optimizer: Any) -> bool:
    """Whether a GradScaler (if one is on) has unscaled this optimizer's gradients already."""
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return True
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
    return getattr(state.get("stage"), "name", "") == "UNSCALED"


def drop_update(model: nn.Module, optimizer: Any, scaler: Any) -> str | None:
    """Make the coming optimizer.step() a no-op by dropping every gradient; None when done, else why not."""
    if not unscaled(scaler, optimizer):
        return _SCALER
    params = list(model.parameters())
    for group in getattr(optimizer, "param_groups", None) or []:
        params.extend(group.get("params", []))
    for p in params:
        p.grad = None
    return None


def act_on(monitor: Any, s: int, fired: set[str], optimizer: Any, scaler: Any) -> None:
    """skip_on and stop_on for the kinds that fired at step s: drop the update, write skips.json.
    (raise_on and stop_on's TrainingAlertError are raised by the caller, after this.)"""
    monitor.skipped = False
    skip = fired & monitor.skip_on
    if skip:
        why = drop_update(monitor.model, optimizer, scaler)
        monitor.skipped = why is None
        note(monitor, s, skip, "skipped" if why is None else "not_skipped", why)
        if why is not None:
            warnings.warn(f"diagnose: step {s}: {why}", RuntimeWarning, stacklevel=4)
    if fired & monitor.stop_on:
        note(monitor, s, fired & monitor.stop_on, "stopped")


def note(monitor: Any, s: int, kinds: set[str], action: str, why: str | None = None) -> None:
    """One entry of skips.json for step s (rank 0 writes it; every rank lists the step in monitor.skips),
    with the spike batch saved at that step, if any."""
    monitor.skips.append(s)
    monitor._skip_list.add(s, kinds, action, monitor._saved, why)
