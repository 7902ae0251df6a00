"""Export a run folder's scalars to TensorBoard event files (extra: `tensorboard`)."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, OutputError, UsageError
from ._fields import flatten
from ._runfolder import Run


def scalars(rec: dict[str, Any]) -> dict[str, float]:
    """The scalars of one metrics record, under TensorBoard tags: the live sinks' names without
    their `diagnose/` prefix (`loss`, `layers/<block>/<field>`, `attention/<site>/<field>/head<h>`),
    every declared field shown in TensorBoard and every number nothing declares."""
    return flatten(rec, place="tensorboard")


def _walltime(rec: dict[str, Any]) -> float | None:
    t = rec.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def summary_writer(logdir: Any, flush_secs: Any, who: str) -> Any:
    """A SummaryWriter on `logdir` (`who` names it in errors), checked first: a path (not a file, not a
    dangling symlink) that can be made. flush_secs: a positive number (checked by the caller)."""
    if not isinstance(logdir, (str, os.PathLike)):
        raise UsageError(f"{who} ({type(logdir).__name__}) is not a path: give a folder's path")
    if os.path.lexists(logdir) and not os.path.isdir(logdir):
        raise ConfigError(f"{who} {os.fspath(logdir)} is a file or a dangling symlink, not a folder: give a "
                          f"folder's path")
    try:
        import tensorboard  # noqa: F401 - torch's writer needs it, and says so less clearly
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(f"{who} needs the tensorboard package: pip install 'diagnose-transformers[tensorboard]'") \
            from None
    try:
        return SummaryWriter(log_dir=os.fspath(logdir), flush_secs=flush_secs)
    except OSError as exc:
        raise OutputError(f"{who} {os.fspath(logdir)} cannot be written ({exc.strerror or exc}): give a folder "
                          f"you can write") from None


def export_tensorboard(run: Run, logdir: str | os.PathLike) -> int:
    """Write every logged scalar (and each alert as text) to `logdir`; returns how many scalars."""
    n = 0
    writer = summary_writer(logdir, 120, "--tensorboard")  # 120 s: SummaryWriter's own default
    try:
        for rec in run.records:
            for tag, value in scalars(rec).items():
                # NaN stays NaN; wall_time is when the step was logged, not when it was exported
                writer.add_scalar(tag, float(value), rec["step"], walltime=_walltime(rec))
                n += 1
        # evaluations under eval/<name>, at their step and time; NaN cells (a metric that evaluation
        # did not log) are left out
        for _, row in run.evals.iterrows():
            for col, value in row.items():
                if col not in ("step", "time", "session") and isinstance(value, (int, float)) and value == value:
                    writer.add_scalar(f"eval/{col}", float(value), int(row["step"]), walltime=_walltime(row))
                    n += 1
        for a in run.alerts:
            writer.add_text(f"alerts/{a.get('kind')}", f"{a.get('where')}: {a.get('message')}  \nhint: {a.get('hint')}",
                            a.get("step", 0))
    finally:
        writer.close()
    return n
