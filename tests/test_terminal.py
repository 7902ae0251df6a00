"""Data on the terminal: text, never markup, never escape sequences."""

from __future__ import annotations

import io

from rich.console import Console

from diagnose._terminal import plain, text


def test_plain_strips_controls_and_bidi_marks():
    assert plain("a\x1b[2Jb\x07c\x9bd\u202ee\u2066f\x00") == "a[2Jbcdef"
    assert plain("one\ntwo\r\tthree\u2028") == "one two  three "
    assert plain("x\r\ny\u2029z", keep_newlines=True) == "x\ny\nz"
    assert plain(3.5) == "3.5"


def test_text_is_never_markup():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="truecolor", width=200)
    for s in ("[/bold]", "[/red] x", "[link=https://evil.example]go[/link]", "[bold]b[/]"):
        console.print(text(s))
    out = buf.getvalue()
    assert "[/bold]" in out and "[link=https://evil.example]go[/link]" in out and "\x1b]8;" not in out
