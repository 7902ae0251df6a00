"""HTML report: reads only `diagnose.heads/1` or `/2` JSON and `diagnose.run/1` run folders (plus
optional `diagnose.checks/1` JSON) and writes one self-contained file.

Modules: _sources (loading), view_heads / _view_training / _summary / _view (the view model),
_decimate, _figures / _plots_heads / _plots_training (pictures), _render (Jinja2 + inlining).
The entry points below import the renderer on first use, so that `import diagnose` does not
pull in matplotlib and seaborn.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._sources import load_sources

__all__ = ["ReportNote", "load_sources", "render_html", "write_report"]



def __getattr__(name: str) -> Any:
    """ReportNote (a note the report shows, such as the CLI's) on first use: its module draws, and
    `import diagnose` must not pull in matplotlib."""
    if name == "ReportNote":
        from ._view import ReportNote

        return ReportNote
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def write_report(sources: Any, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Write one self-contained HTML report of heads results, run folders and checks to `path`.

    sources: `diagnose.heads/1` or `/2` JSON files or objects with .to_json() (a HeadsResult), run
    folders or Runs from `diagnose.read_run`, `diagnose.checks/1` JSON; one or a list. The file
    appears only once complete: a bad source raises InputFileError and leaves `path` untouched.
    Example: diagnose.write_report([result, "runs/exp1"], "report.html")
    """
    from ._render import write_report as _write

    return _write(sources, path, title=title)


def render_html(sources: Any, *, title: str | None = None) -> str:
    """The report's HTML as a string (nothing is written)."""
    from ._render import render_html as _render

    return _render(sources, title=title)
