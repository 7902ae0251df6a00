"""The HTML file: self-contained, strict CSP, every model string escaped, written atomically."""

import base64
import hashlib
import html
import json
import re

import pytest

import report_fixtures as rf
from diagnose.errors import InputFileError
from diagnose.reports import render_html, write_report
from diagnose.reports._render import escape_json

# XML namespace names inside SVG images are identifiers, not addresses anything fetches.
ALLOWED_URLS = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
URL = re.compile(r"https?://[^\s\"'<>)]*")


def _script(text, attrs=""):
    m = re.search(rf"<script{attrs}>(.*?)</script>", text, re.S)
    return m.group(1)


def test_sections_present(report_file):
    text = report_file.read_text()
    for section in ("summary", "heads", "maps", "training", "checks"):
        assert f'<section id="{section}">' in text
    assert text.index('id="summary"') < text.index('id="heads"') < text.index('id="training"')


def test_csp_is_strict_and_names_the_one_script(report_file):
    text = report_file.read_text()
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text).group(1))
    assert "default-src 'none'" in csp and "img-src data:" in csp and "unsafe-eval" not in csp
    script = _script(text)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert len(re.findall(r"<script", text)) == 2  # the JSON blob and the viewer


def test_no_external_url_anywhere(report_file):
    text = report_file.read_text()
    assert not re.search(r"<(link|iframe|object|embed)\b", text)
    assert not re.search(r"\bsrc=\"(?!data:)", text), "every src is a data: URI"
    assert not URL.findall(text)
    for b64 in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", text):
        svg = base64.b64decode(b64).decode()
        assert set(URL.findall(svg)) <= ALLOWED_URLS
        assert "<script" not in svg


def test_token_text_escaped_in_html_and_blob(report_file):
    text = report_file.read_text()
    assert "<img src=x" not in text and "<script>alert" not in text
    assert html.escape(rf.XSS, quote=False) in text  # the kept example, as text
    blob = _script(text, ' type="application/json" id="report-data"')
    assert "<" not in blob and ">" not in blob and "&" not in blob
    data = json.loads(blob)
    assert data["heads"][0]["examples"][0]["tokens"] == rf.HOSTILE_TOKENS


def test_escape_json_round_trips():
    obj = {"t": "</script><!-- & \u2028"}
    s = escape_json(obj)
    assert "</" not in s and "<!--" not in s and json.loads(s) == obj


def test_summary_is_generated_from_the_data(report_file):
    text = html.unescape(re.sub(r"<[^>]+>", " ", report_file.read_text()))
    assert "1 of 8 heads matter when removed" in text
    assert "L1.H2" in text and "striking_but_inert" in text
    assert "nonfinite (error) first at step 200" in text


@pytest.fixture
def quick_plots(monkeypatch):
    """Pictures replaced by a 1-pixel image: these tests are about structure, not drawing."""
    from diagnose.reports import _plots_heads as plots_heads, _plots_training as plots_training

    dot = "data:image/svg+xml;base64," + base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg"/>').decode()
    for mod in (plots_heads, plots_training):
        for name in ("head_grids", "attention_grids", "scatter", "loss_lr", "grad_norms", "depth_over_time",
                     "entropy", "throughput", "eval_metrics", "compare"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, lambda v: dot)


def test_checks_section_only_when_given(inputs, quick_plots):
    heads, run, _ = inputs
    text = render_html([heads, run])
    assert '<section id="checks">' not in text and '<section id="training">' in text
    assert '<section id="training">' not in render_html([heads])


def test_object_sources(inputs, tmp_path, quick_plots):
    heads, run, _ = inputs

    class Result:
        def to_json(self):
            return json.loads(heads.read_text())

    out = write_report([Result()], tmp_path / "sub" / "r.html")
    assert out.exists() and "reference heads (source 1)" in out.read_text()


def test_bad_source_writes_nothing(inputs, tmp_path):
    heads, run, _ = inputs
    out = tmp_path / "report.html"
    out.write_text("old")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputFileError, match=re.escape(str(bad))):
        write_report([heads, bad], out)
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "report.html"]  # no temp file left


def test_same_input_same_bytes(inputs, report_file):
    assert render_html(list(inputs)) == report_file.read_text()


def test_lessons_section(tmp_path, quick_plots):
    path = tmp_path / "lessons.json"
    path.write_text(json.dumps(rf.make_lessons()))
    text = render_html([path])
    assert '<section id="lessons">' in text and '<a href="#lessons">' in text
    assert "&lt;b&gt;gradient spikes&lt;/b&gt;" in text and "<b>gradient" not in text
    cells = re.findall(r"<td>(?:<bdi>)?([^<]*)(?:</bdi>)?</td>", text)  # data text sits in <bdi>
    assert ["max grad norm", "1.23", "45.7", "alerts", "none", "grad_spike x3", "accuracy", "–", "0.500"] == cells[:9]


def test_minimal_documents_render(tmp_path):
    """Only the required fields: no attention statistics, no examples, no per-layer records."""
    heads = {"schema": "diagnose.heads/1", "model": {"n_layers": 1, "n_heads": 2},
             "heads": [{"layer": 0, "head": 0, "delta_loss": 0.5, "p_value": None},
                       {"layer": 0, "head": 1, "delta_loss": None}]}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema": "diagnose.run/1"}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n"
                                               for s in range(5)))
    text = render_html([heads, run])
    assert '<section id="training">' in text and "No alerts." in text
    assert "No example maps were kept" in text and "No head flagged." in text
