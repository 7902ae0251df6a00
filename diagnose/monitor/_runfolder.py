"""The `diagnose.run/1` run folder: a writer that appends and flushes every record, and a
reader that survives a killed writer.

    run.json       schema, model summary, settings, start time, "sessions" (one per
                   TrainingMonitor opened on the folder), "closed" (true once close() ran)
    metrics.jsonl  one object per logged step: step, time, session and the declared record fields
                   (_fields.record_fields: loss, lr, grad_norm, clip_coef, ..., layers {block:
                   {grad_norm, act_mean, ...}}, and on sampled steps attention {site: {entropy:
                   [per head], max_weight: [per head], max_logit: [per head], uniform_entropy: log
                   of the visible keys' count}}); nonfinite_param names the first parameter with a
                   NaN/Inf gradient, when there is one
    alerts.jsonl   step, kind, severity (warning|error), where, message, hint
    evals.jsonl    step, time, loss, metrics {name: number} (TrainingMonitor.log_eval; _evals.py)
    spikes/        the batches behind spike alerts, when save_spikes is on (_spikes.py)

Every file is strict JSON (diagnose/_json.py): a non-finite number is written as null and
named, with its exact value, in the record's `nonfinite` map ({"/loss": "NaN"}); the reader
puts the NaN back, so a NaN is exactly what a reader sees. Older files with bare NaN /
Infinity tokens are read too. Each session records the writer's pid and host, so that
`diagnose stats --follow` can tell a killed writer from a slow one.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from .. import _json
from .._write import atomic_write
from ..errors import InputFileError, OutputError, RunFolderError
from ..io import iter_lines, read_json, require_file
from ._evals import EVALS, check_eval, evals_frame
from ._fields import attention_rows, record_keys, steps_row
from ._records import FIX as _FIX, check_alert, check_info, check_record
from ._spikes import read_spikes

SCHEMA = "diagnose.run/1"
RUN_JSON, METRICS, ALERTS = "run.json", "metrics.jsonl", "alerts.jsonl"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dumps(obj: Any) -> str:
    return _json.dumps(obj, compact=True)


class RestartWarning(UserWarning):
    """A TrainingMonitor opened a folder that already holds a run: records are appended."""


class RunWriter:
    """Appends records to a run folder; each record is flushed before `write_*` returns."""

    def __init__(self, run_dir: str | os.PathLike, info: dict[str, Any]):
        self.dir = Path(run_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # /proc/x, a full disk, a file on the way: one line, not a raw OSError
            raise OutputError(f"{self.dir}: the run folder cannot be made ({exc.strerror or exc}): give a folder "
                              f"you can write (TrainingMonitor's run_dir)") from None
        self._info_path = self.dir / RUN_JSON
        session = {"started": _now(), "pid": os.getpid(), "host": socket.gethostname(),
                   "settings": info.get("settings", {})}
        if self._info_path.exists():
            old = _load_info(self.dir)
            self.info = {**old, **{k: v for k, v in info.items() if k not in ("started", "sessions")}}
            self.info["sessions"] = list(old.get("sessions", [])) + [session]
            self.info["closed"] = False
            last = _last_step(self.dir / METRICS)
            warnings.warn(
                f"{self.dir} already holds a run (last logged step {last}); appending as session "
                f"{len(self.info['sessions']) - 1}", RestartWarning, stacklevel=3)
        else:
            self.info = {"schema": SCHEMA, **info, "started": session["started"], "sessions": [session],
                         "closed": False}
        self.session = len(self.info["sessions"]) - 1
        self._write_info()
        self._metrics = _open_append(self.dir / METRICS)
        self._alerts = _open_append(self.dir / ALERTS)
        self._evals = None  # opened on the first evaluation

    def write_step(self, record: dict[str, Any]) -> None:
        self._metrics.write(_dumps({**record, "session": self.session}) + "\n")
        self._metrics.flush()

    def write_alert(self, alert: dict[str, Any]) -> None:
        self._alerts.write(_dumps(alert) + "\n")
        self._alerts.flush()

    def write_eval(self, record: dict[str, Any]) -> None:
        if self._evals is None:
            self._evals = _open_append(self.dir / EVALS)
        self._evals.write(_dumps({**record, "session": self.session}) + "\n")
        self._evals.flush()

    def close(self, **extra: Any) -> None:
        """Mark the run closed (what `diagnose stats --follow` waits for) and close the files."""
        if self._metrics.closed:
            return
        self._metrics.close()
        self._alerts.close()
        if self._evals is not None:
            self._evals.close()
        self.info.update(closed=True, ended=_now(), **extra)
        self.info["sessions"][-1]["ended"] = self.info["ended"]
        self._write_info()

    def _write_info(self) -> None:
        # Written whole and renamed into place, so a reader never sees half a run.json.
        atomic_write(self._info_path, _json.dumps(self.info, indent=1) + "\n", keep_on_failure=False,
                     what="run.json")


def _open_append(path: Path):
    f = open(path, "a+", encoding="utf-8")
    # A killed writer may have left a torn last line: start on a fresh line so the next
    # record is not glued to it.
    if f.tell() > 0:
        f.seek(f.tell() - 1)
        if f.read(1) != "\n":
            f.write("\n")
            f.flush()
    return f


def _load_info(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_JSON
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is not a folder: give the run folder TrainingMonitor wrote")
    if not path.exists():
        raise RunFolderError(f"{run_dir} is not a diagnose run folder (no run.json): "
                             f"give the folder passed to TrainingMonitor")
    try:
        info = read_json(path, "run.json", "the folder is not a readable diagnose run", limit=64 << 20)
    except InputFileError as exc:  # the readers promise RunFolderError for anything wrong with a run
        raise RunFolderError(str(exc)) from None
    schema = info.get("schema") if isinstance(info, dict) else None
    if schema != SCHEMA:
        raise RunFolderError(f"{path} is not a {SCHEMA} run.json (schema {schema!r}): "
                             f"give a folder written by diagnose.TrainingMonitor")
    check_info(info, str(path))
    return info


def iter_records(path: Path, skipped: list[int] | None = None,
                 check: Callable[[dict[str, Any], str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Parsed JSON lines of `path`; lines that do not parse (a torn write) are skipped and counted.

    Only a regular file is read (a FIFO would block, /dev/zero never end); lines are split on
    "\\n" only and are at most MAX_LINE_BYTES long. `check(record, where)` may refuse a record
    that parses but holds the wrong types.
    """
    if not os.path.lexists(path):
        return
    try:
        yield from _parsed_lines(path, skipped, check)
    except InputFileError as exc:  # a FIFO, a folder, an unreadable file, an endless line
        raise RunFolderError(str(exc)) from None


def _parsed_lines(path: Path, skipped: list[int] | None,
                  check: Callable[[dict[str, Any], str], None] | None) -> Iterator[dict[str, Any]]:
    for number, raw in iter_lines(path, f"{path.name} of a run folder"):
        rec = parse_record(raw, f"{path}, line {number}", skipped, check)
        if rec is not None:
            yield rec


def parse_record(raw: bytes, where: str, skipped: list[int] | None,
                 check: Callable[[dict[str, Any], str], None] | None) -> dict[str, Any] | None:
    """One JSONL line as a record, for every reader (read_run and the live tail alike): None for a blank
    line or one that does not parse (a torn write, nesting too deep: counted in `skipped`); a line that
    parses is checked by `check`, which refuses damage."""
    line = raw.decode("utf-8", "replace").strip()
    if not line:
        return None
    try:
        rec = _json.loads(line)
    except _json.TooLargeError as exc:  # it parses: damage, not a torn write
        if check is not None:
            raise RunFolderError(f"{where}: {exc}; {_FIX}") from None
        rec = None
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        rec = None
    if not isinstance(rec, dict):
        if rec is None and skipped is not None:
            skipped.append(1)
        return None
    if check is not None:
        check(rec, where)
    return rec


def _last_step(path: Path) -> int | None:
    last = None
    for rec in iter_records(path):
        if "step" in rec:
            last = rec["step"]
    return last


@dataclass
class Run:
    """A run folder read back.

    steps: one row per logged step (_fields.steps_row); columns step, time, session, every
    top-level field (loss, lr, grad_norm, ...), `layers/<block>/<field>`, and on sampled steps
    `attention/<site>/<field>_mean` for each per-head field (the mean over heads) and
    `attention/<site>/<field>` for each per-site one (NaN on other steps).
    attention: tidy per-head table: step, site, head, then one column per per-head field
    (entropy, max_weight, max_logit, and whatever a registered measurement writes).
    alerts: the alerts.jsonl records in order. info: run.json.
    evals: one row per TrainingMonitor.log_eval (step, time, loss, one column per metric).
    spikes: the spikes/step_N.json records (batches saved at spike alerts), by step.
    """

    dir: Path
    info: dict[str, Any]
    steps: pd.DataFrame
    alerts: list[dict[str, Any]]
    attention: pd.DataFrame = field(repr=False)
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)
    skipped_lines: int = 0
    evals: pd.DataFrame = field(repr=False, default_factory=lambda: evals_frame([]))
    spikes: list[dict[str, Any]] = field(repr=False, default_factory=list)

    @property
    def layers(self) -> list[str]:
        """Block names in forward order."""
        return list(self.info.get("model", {}).get("blocks", [])) or sorted(
            {c[len("layers/"):].rsplit("/", 1)[0] for c in self.steps.columns if c.startswith("layers/")})

    def fields(self, per: str) -> list[str]:
        """The keys of the `per` fields (model, layer, head, site) this run's records hold:
        the declared ones first, then any other (_fields.record_keys)."""
        return record_keys(self.records, per)

    @property
    def closed(self) -> bool:
        return bool(self.info.get("closed"))


def build_run(run_dir: Path, info: dict[str, Any], records: list[dict[str, Any]],
              alerts: list[dict[str, Any]], skipped: int = 0) -> Run:
    """A Run from already-parsed records (shared by read_run and the live tail)."""
    steps = pd.DataFrame([steps_row(r) for r in records])
    rows, keys = attention_rows(records)
    attention = pd.DataFrame(rows, columns=["step", "site", "head", *keys])
    return Run(run_dir, info, steps, alerts, attention, records, skipped)


def _check_step(rec: dict[str, Any], where: str) -> None:
    if "step" in rec:
        check_record(rec, where)


def _good_eval(rec: dict[str, Any], where: str, skipped: list[int]) -> bool:
    """Whether an evals.jsonl record has the types the readers use; a bad one is counted, not fatal."""
    try:
        check_eval(rec, where)
    except RunFolderError:
        skipped.append(1)
        return False
    return True


def read_run(run_dir: str | os.PathLike, *, allow_empty: bool = False) -> Run:
    """Read a run folder written by TrainingMonitor; a torn last line is skipped, not fatal.

    Raises RunFolderError when the folder is not a run, or (unless allow_empty) holds no step.
    """
    run_dir = Path(run_dir)
    info = _load_info(run_dir)
    skipped: list[int] = []
    records = [r for r in iter_records(run_dir / METRICS, skipped, _check_step) if "step" in r]
    if not records and not allow_empty:
        raise RunFolderError(f"{run_dir} holds no logged steps yet: is the training loop calling "
                             f"monitor.step(loss) after backward()?")
    alerts = list(iter_records(run_dir / ALERTS, skipped, check_alert))
    run = build_run(run_dir, info, records, alerts, len(skipped))
    # side files: a damaged line or record is skipped and counted, never fatal
    evals = [r for r in iter_records(run_dir / EVALS, skipped) if _good_eval(r, str(run_dir / EVALS), skipped)]
    run.evals = evals_frame(evals)
    run.spikes = read_spikes(run_dir, skipped)
    run.skipped_lines = len(skipped)
    return run


POLL_BYTES = 64 << 20  # what one poll reads of a file at most: a huge (or sparse) one is followed over several
LINE_BYTES = 16 << 20  # the longest line, as diagnose.io.iter_lines bounds it for read_run: --follow refuses it too


class RunTail:
    """Incremental reader for a live run: each poll() returns only the new complete lines, reading at
    most POLL_BYTES of each file (a 10 GB sparse file is refused at its first overlong line, as
    read_run refuses it, instead of being read into memory whole)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self._offsets = {METRICS: 0, ALERTS: 0}
        self._more = {METRICS: False, ALERTS: False}  # whether a file holds more than the last poll read
        self.skipped: list[int] = []  # the lines that did not parse (a torn write, nesting too deep), as read_run's

    def _new(self, name: str) -> list[dict[str, Any]]:
        path = self.dir / name
        if not path.exists():
            return []
        try:
            require_file(path, f"{name} of a run folder")  # a FIFO would block the follower
        except InputFileError as exc:
            raise RunFolderError(str(exc)) from None
        with open(path, "rb") as f:
            f.seek(self._offsets[name])
            data = f.read(POLL_BYTES + 1)
        self._more[name], data = len(data) > POLL_BYTES, data[:POLL_BYTES]
        end = data.rfind(b"\n") + 1  # a line without its newline is still being written
        lines = data[:end].split(b"\n")  # "\n" only: JSON strings may hold U+2028
        if max(map(len, lines)) > LINE_BYTES or (end == 0 and len(data) > LINE_BYTES):
            raise RunFolderError(f"{path}: a line after byte {self._offsets[name]:,} is longer than {LINE_BYTES:,} "
                                 f"bytes; {_FIX}")
        self._offsets[name] += end
        out = []
        check = _check_step if name == METRICS else check_alert  # the same checks as read_run's
        for i, line in enumerate(lines):
            rec = parse_record(line, f"{path}, new line {i + 1}", self.skipped, check)
            if rec is not None:
                out.append(rec)
        return out

    @property
    def more(self) -> bool:
        """Whether the last poll left lines to read (it stopped at POLL_BYTES)."""
        return any(self._more.values())

    def poll(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """(new step records, new alerts, closed)."""
        closed = bool(_load_info(self.dir).get("closed"))
        # read after checking `closed` so the records written before closing are included
        steps, alerts = [r for r in self._new(METRICS) if "step" in r], self._new(ALERTS)
        return steps, alerts, closed and not self.more  # closed once all of it was read

    def wait(self, timeout: float, poll_s: float = 0.5) -> None:
        """Sleep until run.json exists or the timeout passes (a run that has not started yet)."""
        end = time.monotonic() + timeout
        while not (self.dir / RUN_JSON).exists() and time.monotonic() < end:
            time.sleep(poll_s)
