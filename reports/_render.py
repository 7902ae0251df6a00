"""Rendering the report view into one self-contained HTML file.

Templates are Jinja2 files with autoescape on; CSS and JS are read from static/ and inlined;
the data the page's script needs is handed over once as JSON in a
<script type="application/json"> tag, with <, > and & escaped so that no token text can end
the tag. A Content-Security-Policy allows no network access at all, images only as data: URIs,
and only the one inline script whose sha256 hash it names.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from diagnose.display import head_label, plain
from diagnose.files import atomic_write, dumps
from diagnose.statistics import role_label

from ._sources import load_sources
from ._view import Report, build_report

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def escape_json(obj: Any) -> str:
    """JSON safe to place inside a <script> element: <, >, & become \\u003c, \\u003e, \\u0026."""
    text = dumps(obj, compact=True, ensure_ascii=False)  # strict JSON: the one policy
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _format_number(value: Any, spec: str = ".3f") -> str:
    """The templates' `num` filter: a number in `spec`, "nan"/"inf" as such, a dash for a missing
    or non-numeric value."""
    if isinstance(value, jinja2.Undefined) or value is None:
        return "–"
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "–"
    except OverflowError:  # an integer of 400 digits (JSON allows it): as large as an infinity
        x = math.inf if value > 0 else -math.inf
    return format(x, spec) if math.isfinite(x) else str(x)


def _bdi(value: Any) -> markupsafe.Markup:
    """Data text in its own bidi isolate: a U+202E in a token or a name reverses only itself,
    never the rest of its line. (Escaped as usual: Markup.format escapes its arguments.)"""
    if isinstance(value, jinja2.Undefined):
        return markupsafe.Markup("")
    return markupsafe.Markup("<bdi>{}</bdi>").format(value)


def _plain(value: Any) -> str:
    """Data text where no element can go (<title>, attributes): bidi and control marks removed."""
    return "" if isinstance(value, jinja2.Undefined) else plain(value)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _format_number
    env.filters["bdi"] = _bdi
    env.filters["plain"] = _plain
    env.filters["head_label"] = head_label  # {{ layer|head_label(head) }}: "L0.H1", as everywhere
    env.filters["role"] = lambda name: role_label(name if isinstance(name, str) else None)  # the registry's words
    return env


def _static(name: str) -> str:
    text = (STATIC / name).read_text(encoding="utf-8")
    assert "</script" not in text.lower() and "</style" not in text.lower(), f"{name} would end its tag"
    return text


def csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
            f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")


def render(report: Report) -> str:
    """The HTML text of a built report."""
    script = _static("report.js")
    return _env().get_template("report.html.j2").render(
        report=report, css=_static("report.css"), script=script, csp=csp(script),
        data_json=escape_json(report.blob))


def render_html(sources: Any, *, title: str | None = None) -> str:
    """Load the sources and return the report's HTML (nothing is written)."""
    return render(build_report(load_sources(sources), title))


def write_report(sources: Any, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Render, then write atomically (a temporary file beside `path`, renamed into place)."""
    html = render_html(sources, title=title)
    return atomic_write(path, html, what="report")
