"""Data text in the report sits in bidi isolates; where no element can go it loses its bidi marks."""

from __future__ import annotations

import report_fixtures as rf

from diagnose.reports._render import render_html

RLO = "\u202e"


def test_data_text_is_isolated_and_the_title_has_no_override(tmp_path):
    heads = rf.write_heads(tmp_path / "h.json", family=f"fam{RLO}ily", tokens=[f"{RLO}gnp.exe", "b", "c"])
    html = render_html([heads], title=f"my{RLO} report")
    assert f"<bdi>fam{RLO}ily</bdi>" in html and f"<bdi>{RLO}gnp.exe</bdi>" in html
    title = html.split("<title>")[1].split("</title>")[0]
    assert title == "my report"
    assert f'alt="layer by head grids of causal effect and attention statistic for' in html
    assert all(RLO not in alt for alt in html.split('alt="')[1:] for alt in [alt.split('"')[0]])
