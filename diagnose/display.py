"""How diagnose shows things to people, for every front end (the CLI, the report, a notebook).

Public and torch-free: `plain(value)` makes text from a file safe to print (no markup, no escape
sequences, no bidi overrides; _terminal.py says why), `text(value)` wraps it in a rich Text that rich
never parses as markup, and `head_label(layer, head)` / `heads_label(heads)` are the one spelling of
a head ("L0.H1", _head_label.py). The CLI and the report import these names from here.
"""

from __future__ import annotations

from ._head_label import head_label, heads_label
from ._terminal import plain, text

__all__ = ["head_label", "heads_label", "plain", "text"]
