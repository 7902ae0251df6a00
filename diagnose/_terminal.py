"""Data shown on a terminal is text, never markup or escape sequences.

Alert messages, block names, file names and config values come from files anyone can
write. Printed through rich they would be parsed as markup (`[/bold]` raises MarkupError,
`[link=...]` emits an OSC-8 hyperlink); printed raw, an ESC sequence can rewrite the screen
or the window title, and a bidi override (U+202E) reverses what follows it. `plain` removes
all of those; `text` wraps the result in a rich Text, which rich never parses as markup.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls (ESC, BEL, CSI, OSC, ...), DEL, and the bidi embedding/override/isolate marks
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_BREAKS = re.compile("[\t\n\r\u2028\u2029]")


def plain(value: Any, *, keep_newlines: bool = False) -> str:
    """str(value) safe to print: control characters removed, line breaks as spaces (unless kept)."""
    s = value if isinstance(value, str) else str(value)
    if keep_newlines:
        s = s.replace("\r\n", "\n").replace("\t", " ")
        s = re.sub("[\r\u2028\u2029]", "\n", s)
    else:
        s = _BREAKS.sub(" ", s)
    return _CONTROL.sub("", s)


def text(value: Any, style: str | None = None):
    """A rich Text holding plain(value): shown exactly as written, whatever brackets it holds."""
    from rich.text import Text

    return Text(plain(value), style=style or "")
