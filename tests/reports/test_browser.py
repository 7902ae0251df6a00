"""The report in a real browser: Debian's chromium driven by Playwright, opened from file://.

Checks what only a browser can: no console error, nothing fetched, the map selector redraws,
and hostile token text shows as text without running anything.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import report_fixtures as rf
from ..versions import missing

pytestmark = pytest.mark.numerics

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def no_browser(reason: str) -> None:
    """In CI a missing browser fails the run; on a user's machine the tests skip, saying why."""
    missing(reason)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        no_browser(f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        no_browser("playwright is not installed (pip install -e '.[test]'; make test installs it)")

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def _open(browser, path: Path):
    """A page on `path` that records console messages, requests and dialogs in pg.events."""
    pg = browser.new_page(viewport={"width": 1300, "height": 1000})
    pg.events = {"console": [], "requests": [], "dialogs": []}
    pg.on("console", lambda m: pg.events["console"].append((m.type, m.text)))
    pg.on("pageerror", lambda e: pg.events["console"].append(("pageerror", str(e))))
    pg.on("request", lambda r: pg.events["requests"].append(r.url))
    pg.on("dialog", lambda d: (pg.events["dialogs"].append(d.message), d.dismiss()))
    pg.goto(path.as_uri())
    pg.wait_for_load_state("load")
    return pg


@pytest.fixture(scope="module")
def page(browser, report_file):
    pg = _open(browser, report_file)
    yield pg
    pg.close()


def _map(pg) -> tuple[str, str]:
    return pg.eval_on_selector("#map-canvas", "c => [c.dataset.view, c.toDataURL()]")


def _hover_last_cell(pg) -> None:
    box = pg.locator("#map-canvas").bounding_box()
    pg.locator("#map-canvas").hover(position={"x": box["width"] - 4, "y": box["height"] - 4})


def test_loads_clean_and_offline(page, report_file):
    errors = [m for m in page.events["console"] if m[0] in ("error", "pageerror")]
    assert not errors
    assert page.events["requests"] == [report_file.as_uri()]
    for section in ("summary", "heads", "maps", "training", "checks"):
        assert page.locator(f"section#{section}").is_visible()
    assert page.locator("img.plot").count() >= 6
    assert all(page.eval_on_selector_all("img.plot", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)"))


def test_selector_changes_the_map(page):
    view0, pixels0 = _map(page)
    assert view0 == "0,0,1,0"  # the flagged head (L0.H1) is shown first
    page.select_option("#map-head", "2")
    view1, pixels1 = _map(page)
    assert view1 == "0,0,2,0" and pixels1 != pixels0
    page.select_option("#map-layer", "1")
    view2, pixels2 = _map(page)
    assert view2 == "0,1,2,0" and pixels2 != pixels1
    page.select_option("#map-example", "1")
    view3, pixels3 = _map(page)
    assert view3 == "0,1,2,1" and pixels3 != pixels2
    page.locator("#map-gallery button").first.click()  # flagged heads first in the gallery
    assert _map(page)[0] == "0,0,1,1"
    assert "striking_but_inert" in page.inner_text("#map-flag")
    _hover_last_cell(page)
    info = page.inner_text("#map-info")
    assert info.startswith("query 7 ") and "key 7 " in info, info


def test_hostile_tokens_are_text(page, tmp_path):
    page.select_option("#map-example", "0")
    spans = page.eval_on_selector_all("#map-tokens span", "s => s.map(x => x.textContent)")
    assert spans == rf.HOSTILE_TOKENS
    page.locator("details.examples summary").click()
    assert rf.XSS in page.inner_text("details.examples")
    assert page.locator('img[src="x"]').count() == 0
    assert page.evaluate("document.scripts.length") == 2
    _hover_last_cell(page)
    assert page.events["dialogs"] == []
    assert not [m for m in page.events["console"] if m[0] in ("error", "pageerror")]


def test_screenshot(page, tmp_path):
    page.select_option("#map-example", "0")
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / "top.png"), clip={"x": 0, "y": 0, "width": 1300, "height": 1000},
                    full_page=True)
    assert (tmp_path / "top.png").stat().st_size > 10_000


def test_report_of_real_outputs(browser, real_report):
    """A monitored run, an ablation sweep and the checks of a trained model, as the user gets them."""
    pg = _open(browser, real_report)
    try:
        assert not [m for m in pg.events["console"] if m[0] in ("error", "pageerror")]
        assert pg.events["requests"] == [real_report.as_uri()]
        for section in ("summary", "heads", "maps", "training", "checks"):
            assert pg.locator(f"section#{section}").is_visible()
        before = _map(pg)
        other = "1" if before[0].split(",")[2] == "0" else "0"
        pg.select_option("#map-head", other)
        after = _map(pg)
        assert after[0].split(",")[2] == other and after[1] != before[1]
        assert pg.locator("#map-tokens span").count() > 0
        # the circuit's graph: its two edges drawn (K in the key colour), their intervals in the hover titles
        assert pg.locator("section#circuit svg.circuit-graph").is_visible()
        assert pg.locator("svg.circuit-graph line.edge").count() == 2
        assert pg.locator("svg.circuit-graph line.edge-k").count() == 1
        titles = pg.eval_on_selector_all("svg.circuit-graph line title", "ts => ts.map(t => t.textContent)")
        assert all("95 % CI" in t for t in titles) and any(t.startswith("L0.H0 -> L1.H0 (k)") for t in titles)
    finally:
        pg.close()


RLO = "\u202e"
_ORDER = """([sel, word]) => {
  /* left edges of the first and last letters of `word` in the first text node under `sel` holding it */
  for (const el of document.querySelectorAll(sel)) {
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const i = n.data.indexOf(word);
      if (i < 0) continue;
      const r = document.createRange(), xs = [];
      for (const k of [i, i + word.length - 1]) { r.setStart(n, k); r.setEnd(n, k + 1); xs.push(r.getBoundingClientRect().left); }
      return xs;
    }
  }
  return null;
}"""


def test_right_to_left_override_reverses_only_its_own_token(browser, tmp_path):
    """A U+202E in a token, a model family or an alert stays inside its <bdi>: the words after it
    on the same line still read left to right."""
    from diagnose.reports import write_report

    heads = rf.write_heads(tmp_path / "heads.json", family=f"fam{RLO}ily", tokens=[f"{RLO}gnp.exe", "after", "tail"])
    run = rf.write_run(tmp_path / "run", steps=30, alerts=[rf.alert(5, where=f"{RLO}blocks.1", message="gradient norm")])
    pg = _open(browser, write_report([heads, run], tmp_path / "r.html"))
    try:
        for sel, word in (("p.meta", "layers"), ("table.alerts td", "gradient"), ("details.examples code", "after")):
            xs = pg.evaluate(_ORDER, [sel, word])
            assert xs is not None and xs[0] < xs[1], (sel, word, xs)
        pg.select_option("#map-example", "0")
        box = pg.locator("#map-canvas").bounding_box()
        pg.locator("#map-canvas").hover(position={"x": 92 + 3, "y": 92 + 3})  # query 0, key 0: the RLO token
        assert RLO in pg.inner_text("#map-info")
        xs = pg.evaluate(_ORDER, ["#map-info", "key"])
        assert xs is not None and xs[0] < xs[1] and box
        assert pg.eval_on_selector_all("#map-info bdi", "b => b.length") == 2
    finally:
        pg.close()


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        no_browser("chromium is not installed")
    for value in ("", "false", "0"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
            no_browser("chromium is not installed")


def test_two_runs_overlaid_with_evals_throughput_and_spike_batches(browser, tmp_path):
    """`diagnose report runs/a runs/b`: one overlay figure and a row per run; each run's evaluations
    and saved spike batches; the spike note (hostile text) shown as text; nothing fetched."""
    from diagnose.reports import write_report

    a = rf.write_run(tmp_path / "runs" / "a", steps=80, clip=1.1, throughput=True, evals_every=20,
                     spike_steps=[40], alerts=[rf.alert(40)])
    b = rf.write_run(tmp_path / "runs" / "b", steps=60, seed=1, loss_scale=1.3,
                     alerts=[rf.alert(30, kind="divergence", severity="error")])
    out = write_report([a, b], tmp_path / "two.html")
    pg = _open(browser, out)
    try:
        assert not [m for m in pg.events["console"] if m[0] in ("error", "pageerror")]
        assert pg.events["requests"] == [out.as_uri()]
        compare = pg.locator("#compare")
        assert compare.is_visible() and "2 runs overlaid" in compare.inner_text()
        rows = pg.eval_on_selector_all("#compare table.compare tbody tr", "rs => rs.map(r => r.innerText)")
        assert len(rows) == 2 and "runs/a" in rows[0] and "runs/b" in rows[1]
        assert "at 1.1" in rows[0] and "accuracy" in rows[0]  # clipping and the last evaluation
        assert all(pg.eval_on_selector_all("img.plot", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)"))
        spikes = pg.locator("table.spikes")
        assert spikes.is_visible() and "input_ids [8×16] int64" in spikes.inner_text()
        assert rf.XSS in spikes.inner_text() and pg.locator('img[src="x"]').count() == 0
        pg.locator("details.evals summary").first.click()
        assert pg.locator("details.evals tbody tr").first.is_visible()
        assert pg.eval_on_selector_all("details.evals tbody tr", "rs => rs.length") == 4
        assert pg.events["dialogs"] == []
    finally:
        pg.close()


def test_a_big_model_shows_each_layer_on_demand(browser, tmp_path):
    """Past a few hundred heads the grids are images without numbers; every layer's heads are one
    click away, and the map viewer reaches any head of any layer."""
    import json

    from diagnose.reports import write_report

    doc = rf.make_heads(20, 16, seq_len=6, n_kept=1, vital=((3, 5),), inert=((2, 1),))
    src = tmp_path / "heads.json"
    src.write_text(json.dumps(doc))
    pg = _open(browser, write_report([src], tmp_path / "big.html"))
    try:
        assert not [m for m in pg.events["console"] if m[0] in ("error", "pageerror")]
        assert pg.events["requests"] == [(tmp_path / "big.html").as_uri()]
        layer = pg.locator('details.layer[data-layer="3"]')
        table = layer.locator("table")
        assert not table.is_visible()
        pg.locator("details.per-layer > summary").click()
        assert "largest Δ loss" in layer.locator("summary").inner_text() and not table.is_visible()
        layer.locator("summary").click()
        assert table.is_visible()
        h = doc["heads"][3 * 16 + 5]
        cells = table.locator("tbody tr").nth(5).locator("td").all_inner_texts()
        assert cells[0] == "L3.H5" and cells[2] == "matters", cells  # a document without verdicts: significant
        assert cells[3] == f"{h['delta_accuracy']:+.3f}" and cells[4] == f"{h['delta_loss']:+.3f}", cells
        assert "(L3.H5)" in layer.locator("summary").inner_text()
        pg.select_option("#map-layer", "19")
        pg.select_option("#map-head", "15")
        assert _map(pg)[0] == "0,19,15,0"
    finally:
        pg.close()
