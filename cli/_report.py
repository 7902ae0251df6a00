"""write_report for the commands that write HTML: what the report left out is said on stderr."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import click


def write_report_noting(sources: Any, path: str, *, title: str | None = None) -> Path:
    """diagnose.write_report, with each ReportNote (e.g. grids too big to draw) as one `note:` line."""
    from diagnose.display import plain
    from diagnose.reports import write_report
    from diagnose.reports import ReportNote

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReportNote)
        out = write_report(sources, path, title=title)
    for note in caught:
        if issubclass(note.category, ReportNote):
            click.echo(f"note: {plain(note.message)}", err=True)
        else:  # not ours: shown as it would have been
            warnings.showwarning(note.message, note.category, note.filename, note.lineno)
    return out
