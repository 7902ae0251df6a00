"""Loading report sources: `diagnose.heads/1` JSON (files or objects with .to_json()), run
folders (`diagnose.run/1`, read with `diagnose.read_run`), `diagnose.checks/1` JSON, and the
demo's `diagnose.lessons/1` JSON.

Every problem with a source raises InputFileError naming that source, before anything is drawn.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from diagnose.errors import DiagnoseError, InputFileError
from diagnose.head_fields import ATTENTION, DOCUMENT_LISTS, DOCUMENT_OBJECTS, FLAGS, INTERVALS, NUMBERS, WORDS
from diagnose.io import read_bytes
from diagnose.schema import Section

from ._heads_json import FILE_LIMIT, parse_source

HEADS_SCHEMA = "diagnose.heads/2"
HEADS_SCHEMAS = ("diagnose.heads/1", HEADS_SCHEMA)  # /1 files (no direct effects) still read
RUN_SCHEMA = "diagnose.run/1"
CHECKS_SCHEMA = "diagnose.checks/1"
LESSONS_SCHEMA = "diagnose.lessons/1"  # the demo's measured design lessons
PRUNE_SCHEMA = "diagnose.prune/1"  # diagnose prune (checked in view_prune.py)
CIRCUIT_SCHEMA = "diagnose.circuit/1"  # diagnose circuit (checked in view_circuit.py)
CHECKPOINTS_SCHEMA = "diagnose.heads-over-checkpoints/1"  # diagnose heads-over (checked in view_checkpoints.py)


@dataclass
class HeadsSource:
    name: str
    data: dict[str, Any]
    sections: list[Section] = field(default_factory=list)  # the document's `sections`, read and checked once


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
class PruneSource:
    name: str
    data: dict[str, Any]


@dataclass
class CircuitSource:
    name: str
    data: dict[str, Any]
    sections: list[Section] = field(default_factory=list)


@dataclass
class CheckpointsSource:
    name: str
    data: dict[str, Any]  # checked by view_checkpoints.check_checkpoints


@dataclass
class Sources:
    heads: list[HeadsSource] = field(default_factory=list)
    runs: list[RunSource] = field(default_factory=list)
    checks: list[ChecksSource] = field(default_factory=list)
    lessons: list[LessonsSource] = field(default_factory=list)
    prune: list[PruneSource] = field(default_factory=list)
    circuit: list[CircuitSource] = field(default_factory=list)
    checkpoints: list[CheckpointsSource] = field(default_factory=list)  # diagnose heads-over (view_checkpoints.py)


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


# A heads document may describe any model, but the report keeps a layers x heads grid per
# statistic in memory: beyond this the declared shape is a broken or hostile file.
MAX_HEADS = 1 << 16  # 256 x 256
_REGENERATE = "regenerate it with `diagnose heads ... --json`"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    """None or a number a float can hold (10**400 is an int JSON allows and float() refuses)."""
    if value is None or isinstance(value, float):
        return True
    return _is_int(value) and abs(value) < 1e308


def _kind(value: Any) -> str:
    if _is_int(value):
        return "an integer too large for a float"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), f"a {type(value).__name__}")


def _check_heads(data: dict[str, Any], where: str) -> None:
    """Every field the report reads has the type it expects, so that drawing cannot fail half-way."""
    model = data.get("model")
    heads = data.get("heads")
    if not isinstance(model, dict) or not isinstance(heads, list) or not heads:
        raise InputFileError(f"{where}: a {HEADS_SCHEMA} document needs `model` and a non-empty "
                             f"`heads` list; {_REGENERATE}")
    for key in ("n_layers", "n_heads"):
        if not _is_int(model.get(key)) or model[key] < 1:
            raise InputFileError(f"{where}: model.{key} must be a positive integer; {_REGENERATE}")
    n_layers, n_heads = model["n_layers"], model["n_heads"]
    if n_layers * n_heads > MAX_HEADS:
        raise InputFileError(f"{where}: declares a {n_layers} x {n_heads} grid of heads, over the {MAX_HEADS:,} "
                             f"heads a report holds; {_REGENERATE}, or give the heads of fewer layers")
    for key in DOCUMENT_OBJECTS:  # as head_fields.py declares the document
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise InputFileError(f"{where}: `{key}` is {_kind(data[key])}, not an object; {_REGENERATE}")
    for key in DOCUMENT_LISTS:
        if data.get(key) is not None and not isinstance(data[key], list):
            raise InputFileError(f"{where}: `{key}` is {_kind(data[key])}, not a list; {_REGENERATE}")
    for key, value in (data.get("baseline") or {}).items():
        if not _is_num(value):
            raise InputFileError(f"{where}: baseline.{key} is {_kind(value)}, not a number; {_REGENERATE}")
    if not _is_num((data.get("timing") or {}).get("seconds")):
        raise InputFileError(f"{where}: timing.seconds is not a number; {_REGENERATE}")
    for i, h in enumerate(heads):
        _check_head(h, i, n_layers, n_heads, where)
    for i, g in enumerate(data.get("together") or []):
        members = g.get("heads") if isinstance(g, dict) else None
        if not isinstance(members, (list, tuple)) or not all(_is_pair(m) for m in members):
            raise InputFileError(f"{where}: together[{i}] needs `heads`, a list of [layer, head] pairs of "
                                 f"integers; {_REGENERATE}")
        for key in ("accuracy", "delta_accuracy", "loss", "delta_loss"):
            if not _is_num(g.get(key)):
                raise InputFileError(f"{where}: together[{i}].{key} is not a number; {_REGENERATE}")
    for i, f in enumerate(data.get("flags") or []):
        members = f.get("heads") if isinstance(f, dict) else None
        if not isinstance(f, dict) or (members is not None and not (
                isinstance(members, (list, tuple)) and all(_is_pair(m) for m in members))):
            raise InputFileError(f"{where}: flags[{i}] is not an object whose `heads` are [layer, head] pairs; "
                                 f"{_REGENERATE}")
        for key, n in (("layer", n_layers), ("head", n_heads)):  # the page marks the flagged head on its grids
            if f.get(key) is not None and not (_is_int(f[key]) and 0 <= f[key] < n):
                raise InputFileError(f"{where}: flags[{i}].{key} {f[key]!r:.20} is not a {key} of the "
                                     f"{n_layers}x{n_heads} model; {_REGENERATE}")


def _is_pair(m: Any) -> bool:
    return isinstance(m, (list, tuple)) and len(m) == 2 and all(_is_int(x) for x in m)


def _check_head(h: Any, i: int, n_layers: int, n_heads: int, where: str) -> None:
    ok = isinstance(h, dict) and _is_int(h.get("layer")) and _is_int(h.get("head"))
    if not ok or not (0 <= h["layer"] < n_layers and 0 <= h["head"] < n_heads):
        raise InputFileError(f"{where}: heads[{i}] has no valid `layer`/`head` for a "
                             f"{n_layers}x{n_heads} model; {_REGENERATE}")
    for f in NUMBERS:  # every per-head field as head_fields.py declares it: the writer's own list
        if not _is_num(h.get(f.key)):
            raise InputFileError(f"{where}: heads[{i}].{f.key} is {_kind(h[f.key])}, not a number; {_REGENERATE}")
    for f in INTERVALS:
        ci = h.get(f.key)
        if ci is not None and not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_is_num(x) for x in ci)):
            raise InputFileError(f"{where}: heads[{i}].{f.key} is not a [low, high] pair; {_REGENERATE}")
    for f in FLAGS:
        if h.get(f.key) is not None and not isinstance(h[f.key], bool):
            raise InputFileError(f"{where}: heads[{i}].{f.key} is {_kind(h[f.key])}, not true/false; {_REGENERATE}")
    for f in WORDS:
        if h.get(f.key) is not None and not isinstance(h[f.key], str):
            raise InputFileError(f"{where}: heads[{i}].{f.key} is {_kind(h[f.key])}, not a string; {_REGENERATE}")
    attention = h.get(ATTENTION)
    if attention is not None and not (isinstance(attention, dict) and all(_is_num(v) for v in attention.values())):
        raise InputFileError(f"{where}: heads[{i}].attention is not an object of numbers; {_REGENERATE}")


def read_sections(data: dict[str, Any], where: str) -> list[Section]:
    """The document's analysis sections (none in a file from before them), each checked by Section.from_json."""
    return [Section.from_json(obj, f"{where}: sections[{i}]") for i, obj in enumerate(data.get("sections") or [])]


def _check_checks(data: dict[str, Any], where: str) -> None:
    findings = data.get("findings")
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        raise InputFileError(f"{where}: a {CHECKS_SCHEMA} document needs a `findings` list of "
                             f"objects; regenerate it with `diagnose check ... --json`")


# A lesson row's `fmt` is a format spec for one number (".3f", "+.1%"), never a template:
# anything else could reach into the value's attributes ("{0.__class__}").
FORMAT_SPEC = re.compile(r"s|[+\- ]?,?(\.\d{1,2})?[%fegd]?")


def _check_lessons(data: dict[str, Any], where: str) -> None:
    lessons = data.get("lessons")
    if not isinstance(lessons, list) or not all(isinstance(x, dict) and isinstance(x.get("rows"), list)
                                                for x in lessons):
        raise InputFileError(f"{where}: a {LESSONS_SCHEMA} document needs a `lessons` list of objects with "
                             f"`rows`; regenerate it with `diagnose demo`")
    for i, lesson in enumerate(lessons):
        for j, row in enumerate(lesson["rows"]):
            fmt = row.get("fmt", "s") if isinstance(row, dict) else None
            if not isinstance(fmt, str) or not FORMAT_SPEC.fullmatch(fmt):
                raise InputFileError(f"{where}: lessons[{i}].rows[{j}] is not an object with a number format "
                                     "such as \".3f\" in `fmt`; regenerate it with `diagnose demo`")


def _schema(data: Any) -> str | None:
    """The document's `schema` when it is a string (a list there is no schema, and no dict key either)."""
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if isinstance(schema, str) else None


def _add_document(out: Sources, data: Any, name: str, where: str) -> None:
    schema = _schema(data)
    if schema in HEADS_SCHEMAS:
        _check_heads(data, where)
        out.heads.append(HeadsSource(name, data, read_sections(data, where)))
    elif schema == CHECKS_SCHEMA:
        _check_checks(data, where)
        out.checks.append(ChecksSource(name, data))
    elif schema == LESSONS_SCHEMA:
        _check_lessons(data, where)
        out.lessons.append(LessonsSource(name, data))
    elif schema == PRUNE_SCHEMA:
        from .view_prune import check_prune

        out.prune.append(PruneSource(name, check_prune(data, where)))
    elif schema == CIRCUIT_SCHEMA:
        from .view_circuit import check_circuit

        out.circuit.append(CircuitSource(name, check_circuit(data, where), read_sections(data, where)))
    elif schema == CHECKPOINTS_SCHEMA:
        from .view_checkpoints import check_checkpoints

        out.checkpoints.append(CheckpointsSource(name, check_checkpoints(data, where)))
    else:
        raise InputFileError(f"{where}: not a report source (schema {schema!r}); give "
                             f"{HEADS_SCHEMA}, {CHECKS_SCHEMA}, {PRUNE_SCHEMA}, {CIRCUIT_SCHEMA} or {CHECKPOINTS_SCHEMA} "
                             "JSON files, or run folders")


def _load_path(out: Sources, path: Path) -> None:
    if path.is_dir():
        try:
            out.runs.append(RunSource(_label(path), _read_run(path)))
        except DiagnoseError as exc:
            if str(path) in str(exc):
                raise
            raise InputFileError(f"{path}: {exc}") from None
        return
    if not path.exists() and not path.is_symlink():
        raise InputFileError(f"{path}: no such file or folder; give heads JSON files and run folders")
    data = parse_source(read_bytes(path, "report source", limit=FILE_LIMIT), str(path),
                        "give a file written by `diagnose heads --json`, `diagnose check --json`, "
                        "`diagnose prune --json` or `diagnose demo`")
    _add_document(out, data, _label(path), str(path))


def _object_name(data: Any, i: int) -> str:
    """`reference heads (source 1)`: objects have no file name, so say what they are."""
    model = data.get("model") if isinstance(data, dict) else None
    model = model if isinstance(model, dict) else {}
    what = str(model.get("family") or model.get("class") or "model")
    kind = {"diagnose.heads/1": "heads", HEADS_SCHEMA: "heads", CHECKS_SCHEMA: "checks", LESSONS_SCHEMA: "lessons",
            PRUNE_SCHEMA: "prune", CIRCUIT_SCHEMA: "circuit", CHECKPOINTS_SCHEMA: "checkpoints"}.get(
                _schema(data))
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
    if not (out.heads or out.runs or out.checks or out.lessons or out.prune or out.circuit or out.checkpoints):
        raise InputFileError("no sources given: name at least one heads JSON file or run folder")
    return out
