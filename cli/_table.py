"""The CLI's one table printer: declared columns (`diagnose.schema.Field`) and rows of plain values, as a
rich table whose cells are text (never markup: a value from a file prints as written, plain()).

`diagnose heads` prints its analysis sections through it, and any command with a declared table can:
a section is its title, the table, and its note.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence


def table(columns: Sequence[Any], rows: Iterable[Mapping[str, Any]],
          options: Mapping[str, Mapping[str, Any]] | None = None):
    """A rich Table: a header per field (label and unit), each cell formatted by its field (a string as it
    is: a cell a command composed itself). options: rich Column settings by column key (max_width, ...)."""
    from rich.table import Column, Table

    from diagnose.display import text

    options = options or {}
    out = Table(*(Column(text(c.header), **options.get(c.key, {})) for c in columns))
    for row in rows:
        out.add_row(*(text(c.format(row.get(c.key))) for c in columns))
    return out


def print_sections(out: Any, sections: Iterable[Any]) -> None:
    """Each analysis section: its title, its table (or that it has no rows), and its note."""
    from diagnose.display import text

    for s in sections:
        out.print(text(s.title, "bold"))
        if s.rows:
            out.print(table(s.columns, s.rows))
        else:
            out.print(text("(no rows)"))
        if s.note:
            out.print(text(s.note))
