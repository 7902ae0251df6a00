"""What a check reports: Finding dataclasses and the versioned `diagnose.checks/1` JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _json
from .._write import atomic_write

SCHEMA = "diagnose.checks/1"
SEVERITIES = ("info", "warning", "error")


@dataclass
class Finding:
    """One thing a check found: which check, how bad, what it measured, and how to fix it."""

    check: str
    severity: str  # info | warning | error
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)  # numbers (and short lists of numbers)
    fix: str = ""

    def __post_init__(self) -> None:
        assert self.severity in SEVERITIES, f"severity {self.severity!r} is not one of {SEVERITIES}"

    @property
    def is_problem(self) -> bool:
        """Warnings and errors are problems; an info finding is a measurement worth knowing."""
        return self.severity != "info"

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "title": self.title,
                "evidence": _plain(self.evidence), "fix": self.fix}


class SkipCheck(Exception):
    """Raised by a check that cannot run on this model or data; its message says why."""


class Findings(list):
    """The list of Finding that check_model returns, with what was run, passed and skipped.

    `passed` names the checks that ran and raised no warning or error (an info finding
    may still sit beside it); `skipped` says, per check that could not run, why.
    """

    def __init__(self, findings=(), *, model: dict[str, Any] | None = None,
                 passed: list[str] | None = None, skipped: list[dict[str, str]] | None = None):
        super().__init__(findings)
        self.model = dict(model or {})
        self.passed = list(passed or [])
        self.skipped = list(skipped or [])

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self if f.is_problem]

    def merge(self, other: "Findings", *, part: str | None = None) -> "Findings":
        """Add another run's findings and its passed and skipped checks; this run's model is kept.

        part: the model part the other run examined (an encoder-decoder's "encoder"); it is
        named in each title, in the evidence, and before each check name in passed and skipped.
        """
        if part is None:
            self.extend(other)
            self.passed += other.passed
            self.skipped += other.skipped
            return self
        self.extend(Finding(f.check, f.severity, f"{part}: {f.title}", {**f.evidence, "part": part}, f.fix)
                    for f in other)
        self.passed += [f"{part}.{n}" for n in other.passed]
        self.skipped += [{"check": f"{part}.{s['check']}", "why": s["why"]} for s in other.skipped]
        return self

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "model": _plain(self.model), "findings": [f.to_json() for f in self],
                "passed": list(self.passed), "skipped": [dict(s) for s in self.skipped]}

    def write_json(self, path: str | Path) -> Path:
        """Write the JSON atomically (never half a file)."""
        return atomic_write(path, _json.dumps(self.to_json(), indent=2) + "\n", what="checks JSON")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Findings":
        """Rebuild from `to_json()` output (the report reads this)."""
        from ..errors import InputFileError

        schema = data.get("schema") if isinstance(data, dict) else None
        if schema != SCHEMA:
            raise InputFileError(f"not a {SCHEMA} document (schema={schema!r})")
        return cls([Finding(**f) for f in data["findings"]], model=data.get("model"),
                   passed=data.get("passed"), skipped=data.get("skipped"))


def _plain(value: Any) -> Any:
    """JSON-safe copy: tensors/numpy scalars to floats, NaN/inf to None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    value = float(value)
    return value if math.isfinite(value) else None
