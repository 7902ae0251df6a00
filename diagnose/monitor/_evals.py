"""Evaluation records: TrainingMonitor.log_eval(step, loss=..., **metrics) -> evals.jsonl.

One object per evaluation: step, time, loss (or null), metrics {name: number}. Read back as
Run.evals, a DataFrame with columns step, time, loss and one per metric name.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd

from .._numbers import number, to_float
from ..errors import RunFolderError, UsageError

EVALS = "evals.jsonl"
_FIX = "the file was not written by diagnose.TrainingMonitor, or was edited: restore it or delete it"


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "detach"):  # a tensor
        if getattr(value, "numel", lambda: 1)() != 1:
            raise UsageError(f"log_eval: {name} must be one number, got a tensor of shape {list(value.shape)}")
        value = value.detach().float().item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars
        except (TypeError, ValueError):
            raise UsageError(f"log_eval: {name} must be a number, got {type(value).__name__}") from None
    return to_float(value)  # 10**400 from a metric function: infinity, never an OverflowError


def eval_record(step: int, loss: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    """The evals.jsonl object for one evaluation (numbers as floats; NaN kept, written as strict JSON)."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise UsageError(f"log_eval: step must be an integer, got {type(step).__name__}")
    from ._records import is_step

    if not is_step(step):  # the readers take 0 to 2**63 - 1: refused here rather than skipped there
        raise UsageError(f"log_eval: step must be from 0 to 2**63 - 1, got {step}")
    return {"step": step, "time": time.time(), "loss": _number("loss", loss),
            "metrics": {str(k): _number(str(k), v) for k, v in metrics.items()}}


def log_trainer_eval(monitor: Any, step: int, loss: Any, metrics: dict[str, Any]) -> None:
    """An integration's evaluation, logged without ever stopping the user's training: metrics whose
    values are not numbers are left out, and a failure to record is a warning, not an exception
    inside trainer.evaluate()."""
    numbers = {str(k): v for k, v in metrics.items() if number(v) is not None or _scalar_tensor(v)}
    other = numbers.pop("loss", None)  # a metric called `loss` would be the loss= keyword twice
    loss = other if loss is None else loss
    if loss is not None and number(loss) is None and not _scalar_tensor(loss):
        loss = None
    try:
        monitor.log_eval(int(step), loss=loss, **numbers)
    except Exception as exc:  # noqa: BLE001 -- a diagnostic must not end the run it watches
        import warnings

        warnings.warn(f"diagnose: evaluation at step {step} not recorded ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)


def _scalar_tensor(v: Any) -> bool:
    return hasattr(v, "detach") and getattr(v, "numel", lambda: 0)() == 1 and not v.is_complex()


def check_eval(rec: dict[str, Any], where: str) -> None:
    """Refuse an evals.jsonl line whose fields are not what the readers use."""
    from ._records import is_step

    if not is_step(rec.get("step")):
        raise RunFolderError(f"{where}: `step` is not a step (an integer from 0 to 2**63 - 1); {_FIX}")
    metrics = rec.get("metrics", {})
    ok = lambda v: v is None or number(v) is not None  # noqa: E731
    if not ok(rec.get("loss")) or not ok(rec.get("time")):
        raise RunFolderError(f"{where}: `loss` or `time` is not a number; {_FIX}")
    if not isinstance(metrics, dict) or not all(ok(v) for v in metrics.values()):
        raise RunFolderError(f"{where}: `metrics` is not an object of numbers; {_FIX}")


def evals_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """step, time, loss, then one column per metric (NaN where an evaluation lacks it)."""
    rows = [{"step": r["step"], "time": r.get("time"), "loss": r.get("loss"),
             **{k: (math.nan if v is None else v) for k, v in (r.get("metrics") or {}).items()
                if k not in ("step", "time", "loss")}} for r in records]
    frame = pd.DataFrame(rows, columns=None if rows else ["step", "time", "loss"])
    if "loss" in frame:
        frame["loss"] = pd.to_numeric(frame["loss"], errors="coerce")
    return frame
