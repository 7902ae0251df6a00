"""The page of `diagnose heads-over`: heads x checkpoints and what changed, from the result's JSON only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from diagnose.files import atomic_write

from ._render import _env, _static, csp


def render_checkpoints(data: dict[str, Any], *, title: str | None = None) -> str:
    """The HTML of one `diagnose.heads-over-checkpoints/1` JSON object (self-contained, no script, offline)."""
    title = title or f"Heads over {len(data['checkpoints'])} checkpoints"
    return _env().get_template("checkpoints.html.j2").render(r=data, title=title, css=_static("report.css"),
                                                             csp=csp(""))


def write_checkpoints_report(data: dict[str, Any], path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Render, then write atomically."""
    return atomic_write(path, render_checkpoints(data, title=title), what="report")
