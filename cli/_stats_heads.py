"""The heads section of `diagnose stats`: the head events in words, and with --heads each head's
importance and role at the sampled steps (diagnose.monitor.heads_summary)."""

from __future__ import annotations

from typing import Any


def print_heads(summary: dict[str, Any], console, full: bool) -> None:
    """The events (always); with `full`, the table of heads x sampled steps."""
    from rich.table import Table
    from rich.text import Text

    from diagnose.display import plain
    from diagnose.monitor import head_event_lines, head_rows

    for line in head_event_lines(summary):
        console.print(Text(plain(line)))
    if not full:
        return
    header, rows = head_rows(summary)
    if not rows:
        console.print(Text("no per-head importance recorded: the run sampled no attention step with a backward"))
        return
    t = Table(title="heads over training: importance |dL/dgate| and role (F first token, P previous, "
                    "I induction, D duplicate, B broad)", title_justify="left")
    for i, col in enumerate(header):
        t.add_column(Text(col), justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*(Text(plain(c)) for c in r))
    console.print(t)
