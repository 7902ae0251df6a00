"""Loading report sources: `diagnose.heads/1` JSON (files or objects with .to_json()), run
folders (`diagnose.run/1`, read with `diagnose.read_run`), `diagnose.checks/1` JSON, and the
demo's `diagnose.lessons/1` JSON.

Every problem with a source raises InputFileError naming that source, before anything is drawn.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from diagnose import _json
from diagnose.errors import DiagnoseError, InputFileError

HEADS_SCHEMA = "diagnose.heads/1"
RUN_SCHEMA = "diagnose.run/1"
CHECKS_SCHEMA = "diagnose.checks/1"
LESSONS_SCHEMA = "diagnose.lessons/1"  # the demo's measured design lessons


@dataclass
class HeadsSource:
    name: str
    data: dict[str, Any]


@dataclass
class RunSource:
    name: str
    run: Any  # diagnose Run: .steps DataFrame, .attention DataFrame, .alerts, .info


@dataclass
class ChecksSource:
    name: str
    data: dict[str, Any]


@dataclass
class LessonsSource:
    name: str
    data: dict[str, Any]


@dataclass
class Sources:
    heads: list[HeadsSource] = field(default_factory=list)
    runs: list[RunSource] = field(default_factory=list)
    checks: list[ChecksSource] = field(default_factory=list)
    lessons: list[LessonsSource] = field(default_factory=list)


def _read_run(path: Path):
    # The one run-folder parser is the monitor's; imported on use so that loading heads JSON
    # does not pull in the monitor.
    from diagnose.monitor import read_run

    return read_run(path)


def _label(path: Path) -> str:
    """A short, recognisable name: `induction/heads` for demo-out/induction/heads.json."""
    stem = path.name if path.is_dir() else path.stem
    parent = path.resolve().parent.name
    return f"{parent}/{stem}" if parent else stem


def _check_heads(data: dict[str, Any], where: str) -> None:
    model = data.get("model")
    heads = data.get("heads")
    if not isinstance(model, dict) or not isinstance(heads, list) or not heads:
        raise InputFileError(f"{where}: a {HEADS_SCHEMA} document needs `model` and a non-empty "
                             f"`heads` list; regenerate it with `diagnose heads ... --json`")
    for key in ("n_layers", "n_heads"):
        if not isinstance(model.get(key), int) or model[key] < 1:
            raise InputFileError(f"{where}: model.{key} must be a positive integer; "
                                 f"regenerate it with `diagnose heads ... --json`")
    for i, h in enumerate(heads):
        ok = isinstance(h, dict) and isinstance(h.get("layer"), int) and isinstance(h.get("head"), int)
        if not ok or not (0 <= h["layer"] < model["n_layers"] and 0 <= h["head"] < model["n_heads"]):
            raise InputFileError(f"{where}: heads[{i}] has no valid `layer`/`head` for a "
                                 f"{model['n_layers']}x{model['n_heads']} model")


def _check_checks(data: dict[str, Any], where: str) -> None:
    findings = data.get("findings")
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        raise InputFileError(f"{where}: a {CHECKS_SCHEMA} document needs a `findings` list of "
                             f"objects; regenerate it with `diagnose check ... --json`")


def _check_lessons(data: dict[str, Any], where: str) -> None:
    lessons = data.get("lessons")
    if not isinstance(lessons, list) or not all(isinstance(x, dict) and isinstance(x.get("rows"), list)
                                                for x in lessons):
        raise InputFileError(f"{where}: a {LESSONS_SCHEMA} document needs a `lessons` list of objects with "
                             f"`rows`; regenerate it with `diagnose demo`")


def _add_document(out: Sources, data: Any, name: str, where: str) -> None:
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == HEADS_SCHEMA:
        _check_heads(data, where)
        out.heads.append(HeadsSource(name, data))
    elif schema == CHECKS_SCHEMA:
        _check_checks(data, where)
        out.checks.append(ChecksSource(name, data))
    elif schema == LESSONS_SCHEMA:
        _check_lessons(data, where)
        out.lessons.append(LessonsSource(name, data))
    else:
        raise InputFileError(f"{where}: not a report source (schema {schema!r}); give "
                             f"{HEADS_SCHEMA} or {CHECKS_SCHEMA} JSON files, or run folders")


def _load_path(out: Sources, path: Path) -> None:
    if path.is_dir():
        try:
            out.runs.append(RunSource(_label(path), _read_run(path)))
        except DiagnoseError as exc:
            if str(path) in str(exc):
                raise
            raise InputFileError(f"{path}: {exc}") from None
        return
    if not path.is_file():
        raise InputFileError(f"{path}: no such file or folder; give heads JSON files and run folders")
    try:
        data = _json.loads(path.read_text(encoding="utf-8"))  # the `nonfinite` map restored
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{path}: not readable JSON ({exc}); give a file written by "
                             f"`diagnose heads --json`") from None
    _add_document(out, data, _label(path), str(path))


def _object_name(data: Any, i: int) -> str:
    """`reference heads (source 1)`: objects have no file name, so say what they are."""
    model = data.get("model") if isinstance(data, dict) else None
    model = model if isinstance(model, dict) else {}
    what = str(model.get("family") or model.get("class") or "model")
    kind = {HEADS_SCHEMA: "heads", CHECKS_SCHEMA: "checks", LESSONS_SCHEMA: "lessons"}.get(data.get("schema") if isinstance(data, dict) else "")
    return f"{what} {kind or 'source'} (source {i + 1})"


def _is_run(obj: Any) -> bool:
    return hasattr(obj, "steps") and hasattr(obj, "alerts")


def load_sources(sources: Any) -> Sources:
    """Sort sources into heads results, runs and checks; one bad source raises InputFileError."""
    if isinstance(sources, (str, os.PathLike)) or hasattr(sources, "to_json") or _is_run(sources) \
            or isinstance(sources, dict):
        sources = [sources]
    out = Sources()
    for i, src in enumerate(sources if isinstance(sources, Iterable) else [sources]):
        if isinstance(src, (str, os.PathLike)):
            _load_path(out, Path(src))
        elif _is_run(src):
            out.runs.append(RunSource(Path(getattr(src, "dir", f"run-{i + 1}")).name, src))
        elif hasattr(src, "to_json") or isinstance(src, dict):
            data = src.to_json() if hasattr(src, "to_json") else src
            _add_document(out, data, _object_name(data, i), f"source {i + 1} ({type(src).__name__})")
        else:
            raise InputFileError(f"source {i + 1} ({type(src).__name__}) is not a report source: give "
                                 f"heads JSON paths or results, run folders, or checks JSON")
    if not (out.heads or out.runs or out.checks or out.lessons):
        raise InputFileError("no sources given: name at least one heads JSON file or run folder")
    return out
