"""The read side, declared: a `Field` says what one number or word of a record or result is, and a
`Section` is one table of an analysis result (its columns are fields, its rows plain values).

Every reader walks these declarations instead of a hand list of names: the run-folder readers,
the TensorBoard export, `diagnose stats`, the CLI tables and the report. A new per-head signal, a
per-layer field or an analysis section is declared once (next to what computes it) and every
reader shows it.

Torch-free on purpose: the report (which reads only files) and `--help` import it.

    Field(key, label, fmt, unit, per, show)
        key    the name in the record or JSON row
        label  what it is, in words (table headers, plot axes)
        fmt    a format spec for its values (".3f", ".2%", "d", "s" for words)
        unit   shown beside the label where it helps ("nats", "s")
        per    what one value belongs to: PER
        show   where it is shown: a subset of PLACES (empty: in the JSON only)

    Section(name, title, columns, rows, note)  ->  to_json() / Section.from_json(obj, where)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ._numbers import number
from .errors import ConfigError, InputFileError

SECTION_SCHEMA = "diagnose.section/1"
PER = ("model", "layer", "head", "site", "example", "row")  # what one value of a field belongs to
PLACES = ("cli", "table", "report", "tensorboard", "sink", "plot")  # where a field can be shown
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_.-")


@dataclass(frozen=True)
class Field:
    """One declared value: a record key, a per-head statistic, a column of a section."""

    key: str
    label: str
    fmt: str = ".3g"
    unit: str = ""
    per: str = "row"
    show: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError(f"a field needs a non-empty string key, got {self.key!r}")
        if self.per not in PER:
            raise ConfigError(f"field {self.key!r}: per must be one of {PER}, got {self.per!r}")
        unknown = set(self.show) - set(PLACES)
        if unknown:
            raise ConfigError(f"field {self.key!r}: show names unknown places {sorted(unknown)}; use {PLACES}")
        object.__setattr__(self, "show", frozenset(self.show))
        format_value(1.0, self.fmt)  # a bad format spec fails here, where it is declared

    @property
    def header(self) -> str:
        """The column header: the label, with the unit in brackets when there is one."""
        return f"{self.label} [{self.unit}]" if self.unit else self.label

    def format(self, value: Any) -> str:
        return format_value(value, self.fmt)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "fmt": self.fmt, "unit": self.unit}


def format_value(value: Any, fmt: str) -> str:
    """One way to print a value in a table: missing values as '-', non-finite as nan/inf, words as
    they are, numbers by the field's format spec (an integer spec rounds a float first)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    x = number(value)
    if x is None:
        return str(value)
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if fmt == "s":
        return f"{x:g}"
    try:
        return format(int(round(x)) if fmt.endswith("d") else x, fmt)
    except ValueError:
        raise ConfigError(f"format spec {fmt!r} cannot format numbers; use e.g. '.3f', '.2%', 'd' or 's'") from None


def fields_of(fields: Iterable[Field], place: str) -> list[Field]:
    """The fields shown at `place`, in declaration order."""
    if place not in PLACES:
        raise ConfigError(f"unknown place {place!r}; use one of {PLACES}")
    return [f for f in fields if place in f.show]


@dataclass
class Section:
    """One table of an analysis result: what the CLI prints, the JSON carries and the report draws.

    rows: one dict per row, keyed by the columns' keys; a value is a number, a string, a bool or
    None (missing). A result carries its sections in its JSON under `sections`."""

    name: str
    title: str
    columns: tuple[Field, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def __post_init__(self) -> None:
        if not self.name or set(self.name) - _NAME_CHARS:
            raise ConfigError(f"a section name is lower-case letters, digits and _.- (got {self.name!r})")
        self.columns = tuple(self.columns)
        keys = [c.key for c in self.columns]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"section {self.name!r}: column keys must be distinct, got {keys}")
        for i, row in enumerate(self.rows):
            extra = set(row) - set(keys)
            if extra:
                raise ConfigError(f"section {self.name!r}: row {i} has keys {sorted(extra)} that no column declares")

    def cells(self) -> list[list[str]]:
        """Every row formatted by its columns: what a table printer prints."""
        return [[c.format(row.get(c.key)) for c in self.columns] for row in self.rows]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SECTION_SCHEMA, "name": self.name, "title": self.title, "note": self.note,
                "columns": [c.to_json() for c in self.columns],
                "rows": [{c.key: row.get(c.key) for c in self.columns} for row in self.rows]}

    @classmethod
    def from_json(cls, obj: Any, where: str = "section") -> "Section":
        """Read a section back, refusing what does not fit the declaration (the file and the fix)."""
        if not isinstance(obj, Mapping):
            raise InputFileError(f"{where}: a section must be an object, got {type(obj).__name__}")
        for key in ("name", "title"):
            if not isinstance(obj.get(key), str):
                raise InputFileError(f"{where}: section {key!r} must be a string")
        cols, rows = obj.get("columns"), obj.get("rows")
        if not isinstance(cols, list) or not isinstance(rows, list):
            raise InputFileError(f"{where}: section {obj['name']!r} needs lists 'columns' and 'rows'")
        if len(cols) > MAX_SECTION_COLUMNS or len(rows) > MAX_SECTION_ROWS:  # a row per head at most
            raise InputFileError(f"{where}: section {obj['name']!r:.40} has {len(rows):,} rows of {len(cols):,} "
                                 f"columns, over the {MAX_SECTION_ROWS:,} x {MAX_SECTION_COLUMNS} a report shows; "
                                 "rewrite it with the diagnose that made it")
        try:
            columns = tuple(_column(c) for c in cols)
            return cls(obj["name"], obj["title"], columns, [_row(r) for r in rows], str(obj.get("note") or ""))
        except (ConfigError, TypeError, ValueError) as exc:
            raise InputFileError(f"{where}: section {obj['name']!r} is malformed: {exc}; rewrite it with the "
                                 "diagnose that made it") from None


MAX_SECTION_ROWS = 1 << 16  # a section has a row per head at most (reports/_sources.py: MAX_HEADS)
MAX_SECTION_COLUMNS = 64


def _column(c: Any) -> Field:
    if not isinstance(c, Mapping) or not isinstance(c.get("key"), str) or \
            not all(isinstance(c.get(k, ""), str) for k in ("label", "fmt", "unit")):
        raise ConfigError("each column is an object with string key, label, fmt and unit")
    return Field(c["key"], c.get("label") or c["key"], c.get("fmt") or ".3g", c.get("unit") or "")


def _row(r: Any) -> dict[str, Any]:
    if not isinstance(r, Mapping):
        raise ConfigError("each row is an object")
    out = {}
    for k, v in r.items():
        if v is not None and not isinstance(v, (str, bool)) and number(v) is None:
            raise ConfigError(f"row value {k!r} is {type(v).__name__}, not a number, string, bool or null")
        out[k] = v
    return out
