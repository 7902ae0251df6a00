"""The one spelling of a head's name, "L0.H1" (layer 0, head 1), for every table, line and page.

Torch-free, so the CLI's output, the report (a Jinja filter, `{{ layer|head_label(head) }}`) and the
library's sentences all print a head the same way; tests/test_head_label.py keeps a second spelling
from coming back. (`--together` also reads "L0H1" and "0.1" on input; it prints this one.)
"""

from __future__ import annotations

from typing import Iterable


def head_label(layer: int, head: int) -> str:
    """'L{layer}.H{head}': head_label(0, 1) == 'L0.H1'."""
    return f"L{layer}.H{head}"


def heads_label(heads: Iterable[tuple[int, int]], sep: str = " + ") -> str:
    """Several heads, e.g. closed together: heads_label([(0, 1), (2, 3)]) == 'L0.H1 + L2.H3'."""
    return sep.join(head_label(layer, head) for layer, head in heads)
