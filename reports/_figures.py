"""Turning a matplotlib Figure into an inline image the page can show under a strict CSP.

Figures are built with `matplotlib.figure.Figure` (never pyplot: no global state, no GUI
backend) and embedded as base64 SVG data URIs in <img>, so no script inside an image can run
and nothing is fetched. The SVG's metadata and DOCTYPE (which carry web addresses and a date)
are stripped, and ids are salted with a constant, so the same data gives the same bytes.
"""

from __future__ import annotations

import base64
import io
import re
from contextlib import contextmanager
from typing import Iterator

import matplotlib
from matplotlib.figure import Figure

RC = {
    "svg.fonttype": "path",  # glyphs as paths: the image needs no font and no text rendering
    "svg.hashsalt": "diagnose-report",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
SEVERITY_COLOR = {"error": "#c62828", "warning": "#ef8f00"}
_STRIP = (re.compile(r"<metadata>.*?</metadata>", re.S), re.compile(r"<!DOCTYPE[^>]*>"))


@contextmanager
def style() -> Iterator[None]:
    with matplotlib.rc_context(RC):
        yield


def new_figure(width: float, height: float, *, left: float = 0.8, right: float = 0.3, bottom: float = 0.5,
               top: float = 0.45, wspace: float = 0.3, hspace: float = 0.3) -> Figure:
    """A Figure with fixed margins in inches (constrained layout doubled the drawing time)."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=wspace, hspace=hspace)
    return fig


def to_data_uri(fig: Figure) -> str:
    """The figure as `data:image/svg+xml;base64,...`."""
    buf = io.StringIO()
    with style():
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    for pattern in _STRIP:
        svg = pattern.sub("", svg)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")
