"""A new analysis is one registered step returning a Section: run by `diagnose heads` on a saved model, its
table is in the JSON (`sections`), in the CLI's output (the one table printer) and in the report (the one
macro, escaped), with no change to the CLI's, the JSON's or the report's code. Its option (an
AblationConfig field) turns it off; a malformed section in a file is refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.ablation import ANALYSES, Analysis, register_analysis, unregister_analysis
from diagnose.cli.main import cli
from diagnose.errors import ConfigError
from diagnose.schema import Field, Section
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx

pytestmark = pytest.mark.numerics

TITLE = "Toy: heads per layer <b>& co</b>"  # markup that must reach the page as text
COLUMNS = (Field("layer", "layer", "d"), Field("n_heads", "heads", "d"),
           Field("sum_delta_loss", "Σ Δ loss", "+.4f", "nats"), Field("who", "most harmful", "s"))


def toy_step(given) -> Section:
    """Per attention site: its heads (from the model's sites) and the summed Δ loss of its heads (the result)."""
    rows = []
    for layer, site in enumerate(given.sites):
        mine = [h for h in given.result.heads if h.layer == layer]
        worst = max(mine, key=lambda h: h.delta_loss)
        rows.append({"layer": layer, "n_heads": site.n_heads, "sum_delta_loss": sum(h.delta_loss for h in mine),
                     "who": f"<i>L{worst.layer}.H{worst.head}</i>"})
    return Section("toy-layers", TITLE, COLUMNS, rows, note=f"{given.config.method} ablation & nothing else")


@pytest.fixture
def saved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=6, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 6, (12, 8))}, tmp_path / "data.pt")
    return tmp_path


@pytest.fixture
def toy():
    """The toy step registered for one test (under the `direct` option, so --no-direct turns it off)."""
    step = register_analysis(Analysis("toy-layers", toy_step, option="direct"))
    try:
        yield step
    finally:
        unregister_analysis(step.name)


def test_a_registered_section_reaches_the_json_the_cli_and_the_report(saved, toy):
    result = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "data.pt", "--json", "h.json", "--html", "h.html"])
    assert result.exit_code == 0, result.output
    doc = json.loads((saved / "h.json").read_text())
    (section,) = doc["sections"]
    assert section["name"] == "toy-layers" and section["title"] == TITLE
    assert [c["key"] for c in section["columns"]] == [c.key for c in COLUMNS]
    for row in section["rows"]:  # the step's numbers are the sweep's own
        mine = [h["delta_loss"] for h in doc["heads"] if h["layer"] == row["layer"]]
        assert row["n_heads"] == 2 and row["sum_delta_loss"] == approx(sum(mine), dtype=torch.float64, width=2)
    assert [r["layer"] for r in section["rows"]] == [0, 1]

    out = result.stdout
    assert TITLE in out and "Σ Δ loss [nats]" in out and "most harmful" in out  # the one table printer
    read = Section.from_json(section)
    for cells in read.cells():
        assert all(cell in out for cell in cells)
    assert "ablation & nothing else" in out

    html = (saved / "h.html").read_text()
    assert "Toy: heads per layer &lt;b&gt;&amp; co&lt;/b&gt;" in html and TITLE not in html  # escaped
    assert "<th><bdi>Σ Δ loss [nats]</bdi></th>" in html
    for cells in read.cells():
        assert "".join(f"<td><bdi>{c}</bdi></td>" for c in cells).replace("<i>", "&lt;i&gt;").replace(
            "</i>", "&lt;/i&gt;") in html
    assert "<i>L" not in html


def test_its_option_turns_it_off_and_older_files_have_none(saved, toy):
    result = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "data.pt", "--json", "h.json", "--no-direct"])
    assert result.exit_code == 0, result.output
    doc = json.loads((saved / "h.json").read_text())
    assert doc["sections"] == [] and TITLE not in result.stdout
    del doc["sections"]  # a diagnose.heads/2 file from before sections
    (saved / "old.json").write_text(json.dumps(doc))
    assert CliRunner().invoke(cli, ["report", "old.json", "-o", "old.html"]).exit_code == 0
    page = (saved / "old.html").read_text()
    assert 'data-section="top-heads"' in page and page.count('class="analysis-section"') == 1  # its own table only


def test_a_malformed_section_is_refused_with_one_line(saved):
    doc = {"schema": "diagnose.heads/2", "model": {"n_layers": 1, "n_heads": 1},
           "heads": [{"layer": 0, "head": 0}],
           "sections": [{"name": "toy", "title": "t", "columns": [{"key": "x", "label": "x"}],
                         "rows": [{"x": {"nested": 1}}]}]}
    (saved / "bad.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["report", "bad.json", "-o", "bad.html"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.json: sections[0]" in lines[0] and "'toy' is malformed" in lines[0]
    assert not (saved / "bad.html").exists()


def test_a_step_is_checked_when_registered_and_when_run():
    with pytest.raises(ConfigError, match="not a field of AblationConfig"):
        register_analysis(Analysis("toy", toy_step, option="circuits"))
    with pytest.raises(ConfigError, match="section name"):
        register_analysis(Analysis("Toy Layers", toy_step))
    with pytest.raises(ConfigError, match="not registered"):
        unregister_analysis("toy")
    assert "toy" not in ANALYSES


def test_the_table_printer_prints_values_as_text():
    """A value from a file is text to the one printer, never rich markup or an escape sequence."""
    from rich.console import Console

    from diagnose.cli._table import print_sections

    console = Console(record=True, width=120)
    rows = [{"sum_delta_loss": None, "who": "[/i]\x1b[2J"}]
    print_sections(console, [Section("t", "[bold]title[/bold]", COLUMNS[2:], rows,
                                     note="[link=http://x]n[/link]")])
    out = console.export_text()
    assert "[bold]title[/bold]" in out and "[/i][2J" in out and "[link=http://x]n[/link]" in out and "\x1b" not in out
    assert "│ -" in out  # a missing value is a dash
