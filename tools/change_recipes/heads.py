"""The `diagnose heads` side: a per-head attention statistic, a role statistic, an ablation method and an
analysis section, each a built-in entry in the file where its kind's built-ins live."""

from __future__ import annotations

from . import Recipe, append_entry, insert, new, replace

STATS = "diagnose/statistics.py"
REGISTRY_TEST = "tests/test_attention_stats_registry.py"

# ---- a per-head attention statistic -------------------------------------------------------------------

STATISTIC_TEST = '''
"""The built-in `second_token` statistic: computed from the attention rows, written in the heads JSON
(and its rank correlation) by `diagnose heads --json`, shown in the report's tables and plots."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.attention_stats import HeadStats
from diagnose.cli.main import cli
from diagnose.reports import _plots_heads as plots
from diagnose.reports.view_heads import heads_view
from diagnose.statistics import STATISTICS
from diagnose.zoo import ModelConfig, Transformer

from .tolerance import approx

pytestmark = pytest.mark.numerics  # floats compared: every kernel path

T = 5


def test_it_is_the_mass_on_the_second_key():
    probs = torch.zeros(1, 2, T, T)  # [B, H, Tq, Tk]
    probs[0, 0, :, 1] = 1.0  # head 0: every row on key 1
    probs[0, 1, :, 0] = 1.0  # head 1: every row on key 0
    acc = HeadStats(2)
    acc.update(probs)
    assert acc.result()["second_token"] == approx([1.0, 0.0], scale=1.0, width=probs.numel())


def test_it_reaches_the_json_the_cli_and_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=6, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 6, (16, 8))}, tmp_path / "data.pt")
    result = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "data.pt", "--json", "h.json", "--html", "h.html"])
    assert result.exit_code == 0, result.output
    column = STATISTICS["second_token"].column
    doc = json.loads((tmp_path / "h.json").read_text())
    values = [h["attention"]["second_token"] for h in doc["heads"]]
    assert all(0.0 <= x <= 1.0 for x in values) and max(values) > 0.0
    assert math.isfinite(doc["correlations"]["second_token"]["rho"])
    headers = re.findall(r"<th>(?:<bdi>)?([^<]*)(?:</bdi>)?</th>", (tmp_path / "h.html").read_text())
    assert headers.count(column) == headers.count("first token") >= 1
    view = heads_view("h", doc)
    assert view.layers()[1].rows[0].values["second_token"] == approx(doc["heads"][2]["attention"]["second_token"])
    assert "second_token" in plots.drawn(view, "scatter") and plots.scatter(view) is not None
'''

STATISTIC = Recipe(
    "statistic", "a new per-head attention statistic, in the JSON and the report's tables and plots",
    ("per-head attention statistic",),
    (append_entry(STATS, "_BUILTINS = (",
                  '    Statistic("second_token", "mass on second token", "2nd token", lambda c: c.at(c.q_pos * 0 + 1),\n'
                  '              show=frozenset({"table", "grid", "scatter"})),'),
     new("tests/test_second_token.py", STATISTIC_TEST),
     insert("docs/heads.md", "The built-in `second_token` statistic is the mass on the second position (a second "
            "sink some models keep).\n"),
     # the shipped lists are pinned on purpose (what each table showed before the registry): a built-in moves them
     replace(REGISTRY_TEST, '"induction")', '"induction", "second_token")'),
     replace(REGISTRY_TEST, '[s.name for s in shown("cli")] == [s.name for s in shown("table")] == [',
             '[s.name for s in shown("table")][:-1] == [s.name for s in shown("cli")] == ['),
     replace(REGISTRY_TEST, '"prev_token", "induction"]', '"prev_token", "induction", "second_token"]'),
     replace(REGISTRY_TEST, '{"entropy", "max_weight", "first_token"}', '{"entropy", "max_weight", "first_token", '
             '"second_token"}'),
),
    "tests/test_second_token.py",
    guards=(REGISTRY_TEST, "tests/cli/test_heads_statistic.py"),
    note="the pin of the shipped statistics and their places moves (counted). Not in the CLI's table: at its 132 "
         "columns it holds four statistics, and a fifth cuts the last column (tests/cli/test_heads_statistic.py's "
         "toy then reads `sam tok`); `diagnose heads --json` writes it.")

# ---- a role statistic ---------------------------------------------------------------------------------

ROLE_TEST = '''
"""The built-in `three_back` role: heads are clustered on it and named by it (roles.py), contrast calls a
head striking for it in words, and the CLI's table, the report's tables and its role key name it."""

from __future__ import annotations

import numpy as np
from rich.console import Console

from diagnose.ablation import contrast, roles
from diagnose.ablation.result import HeadsResult
from diagnose.cli.heads import _table
from diagnose.reports import render_html
from diagnose.reports._plots_heads import role_key
from diagnose.reports.view_heads import heads_view

from .test_contrast import head


def _heads(kinds, share=0.75):
    rng = np.random.default_rng(0)
    out = []
    for i, kind in enumerate(kinds * 3):
        att = {k: 0.0 for k in roles.names() if k != "broad"}
        if kind != "broad":
            att[kind] = share + 0.05 * rng.random()
        att["local"] = att["prev_token"] + att["next_token"]
        out.append(head(i // len(kinds), i % len(kinds), dacc=0.0, dloss=0.0, p=1.0, att=att))
    return out


def test_the_three_back_role_names_heads_in_the_engine_the_cli_and_the_report():
    kinds = ["three_back", "prev_token", "first_token", "broad"]
    assert "three_back" in roles.names() and roles.names()[-1] == "broad"
    heads = _heads(kinds)
    roles.assign(heads)
    assert [h.role for h in heads] == kinds * 3
    lone = [head(1, i, dacc=0.0, dloss=0.0, p=1.0, att={"three_back": 0.1, "max_weight": 0.3}) for i in range(8)]
    lone.append(head(2, 0, dacc=0.0, dloss=0.0, p=1.0, att={"three_back": 0.95, "max_weight": 0.95}))
    for h in lone:
        h.negligible = True
    flag = next(f for f in contrast.flags(lone, 1.0) if (f["layer"], f["head"]) == (2, 0))
    assert flag["kind"] == "striking_but_inert" and "95% of its attention goes three tokens back" in flag["reason"]
    result = HeadsResult({"family": "toy", "n_layers": 3, "n_heads": 4}, "lm", "zero", 10, 10,
                         {"accuracy": 1.0, "loss": 1.0}, heads, {}, [{**flag, "layer": 0, "head": 0}], {}, {})
    console = Console(record=True, width=240)
    console.print(_table(result, "Holm"))
    assert console.export_text().count("three back") == 3
    doc = result.to_json()
    assert [r.role for r in heads_view("toy", doc).layers()[0].rows] == ["three back", "previous token",
                                                                         "first token", "broad"]
    assert role_key()["three_back"] == ("3", "three back")
    assert "<td><bdi>three back</bdi></td>" in render_html(doc)
'''

ROLE = Recipe(
    "role", "a role-like statistic, named as a role by roles.py, contrast, the CLI and the report",
    ("per-head attention statistic",),
    (append_entry(STATS, "_BUILTINS = (",
                  '    Statistic("three_back", "mass three tokens back", "three back", lambda c: c.at(c.q_pos - 3),\n'
                  '              role=Role("three back", "3", "three tokens back")),'),
     new("tests/ablation/test_three_back.py", ROLE_TEST),
     insert("docs/heads.md", "The `three back` role: most of a head's weight three tokens back "
            "(statistic `three_back`).\n"),
     replace(REGISTRY_TEST, '"induction")', '"induction", "three_back")')),
    "tests/ablation/test_three_back.py",
    guards=(REGISTRY_TEST, "tests/ablation/test_role_statistic.py"),
    note="the pin of the shipped statistics' order moves (counted).")

# ---- an ablation method -------------------------------------------------------------------------------

METHOD_TEST = '''
"""The built-in `halve` method: offered by `diagnose heads --method`, run through the one gate, equal to
halving the head's slice of the output projection's input by hand."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diagnose.ablation import ablate_heads
from diagnose.ablation.methods import FOLDABLE, METHODS
from diagnose.cli.main import cli

from .helpers import evaluate, loss_tol
from .test_engine import D, H, N  # noqa: F401  (the reference model's sizes)
from ..tolerance import F64, approx, size_of

pytestmark = pytest.mark.numerics  # ablates, floats compared: every kernel path


def test_it_is_offered_by_heads_not_by_prune():
    assert "halve" in METHODS and "halve" not in FOLDABLE
    assert "halve" in CliRunner().invoke(cli, ["heads", "--help"]).output
    assert "halve" not in CliRunner().invoke(cli, ["prune", "--help"]).output


def test_it_equals_halving_the_head_output_by_hand(model, data):
    result = ablate_heads(model, data, task="lm", method="halve", batch_size=4, attention=False)
    assert result.method == "halve"
    batches = [({k: v[i:i + 4] for k, v in data.items()}, None) for i in range(0, N, 4)]
    base_acc, base_loss = evaluate(model, batches, "lm")
    for layer in range(2):
        for h in range(H):
            def halve(_m, args, h=h):
                x = args[0].clone()  # [B, T, H * D]
                x[:, :, h * D:(h + 1) * D] *= 0.5
                return (x,)

            handle = model.blocks[layer].attn.proj.register_forward_pre_hook(halve)
            try:
                acc, loss = evaluate(model, batches, "lm")
            finally:
                handle.remove()
            got = result.head(layer, h)
            assert got.delta_loss == pytest.approx(loss - base_loss, abs=loss_tol(loss, base_loss, **size_of(model)))
            assert got.delta_accuracy == approx(acc - base_acc, scale=1.0, dtype=F64)
'''

METHOD = Recipe(
    "method", "a new ablation method such as resample", ("ablation method",),
    (append_entry("diagnose/ablation/methods.py", "_BUILTINS = (",
                  '    AblationMethod("halve", "head output scaled by one half", '
                  'lambda state, site, head_out, rows, draw: head_out * 0.5),'),
     new("tests/ablation/test_halve.py", METHOD_TEST),
     insert("docs/heads.md", "`--method halve`: each closed head's output scaled by one half (a partial ablation).\n")),
    "tests/ablation/test_halve.py", guards=("tests/ablation/test_methods.py",),
    note="5 when it brings a setting of its own (`ablation/config.py`, its option in `cli/heads.py`).")

# ---- an analysis section ------------------------------------------------------------------------------

SECTION_STEP = '''
"""The `layer-totals` analysis: per attention layer, its heads' summed effect on the loss and how many of
them matter (the sweep's own numbers, regrouped), as one Section."""

from __future__ import annotations

from ..schema import Field, Section
from .analyses import Analysis, AnalysisInput, register_analysis

COLUMNS = (Field("layer", "layer", "d"), Field("heads", "heads", "d"), Field("sum_delta_loss", "Σ Δ loss", "+.4f", "nats"),
           Field("matter", "heads that matter", "d"))


def layer_totals(given: AnalysisInput) -> Section:
    """One row per layer swept, in layer order."""
    rows = []
    for layer in sorted({h.layer for h in given.result.heads}):
        mine = [h for h in given.result.heads if h.layer == layer]
        rows.append({"layer": layer, "heads": len(mine), "sum_delta_loss": sum(h.delta_loss for h in mine),
                     "matter": sum(1 for h in mine if h.verdict == "matters")})
    return Section("layer-totals", "Heads per layer: summed effect", COLUMNS, rows)


register_analysis(Analysis("layer-totals", layer_totals, option="layer_totals"))
'''

SECTION_TEST = '''
"""The built-in `layer-totals` section: on with --layer-totals, its table is in the JSON, the CLI's output
and the report, its numbers the sweep's own; off by default."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.schema import Section
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx

pytestmark = pytest.mark.numerics  # ablates, floats compared: every kernel path


def _saved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=6, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 6, (12, 8))}, tmp_path / "data.pt")


def test_the_section_reaches_the_json_the_cli_and_the_report(tmp_path, monkeypatch):
    _saved(tmp_path, monkeypatch)
    args = ["heads", "lm.pt", "--data", "data.pt", "--no-direct", "--json", "h.json", "--html", "h.html"]
    result = CliRunner().invoke(cli, [*args, "--layer-totals"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "h.json").read_text())
    (section,) = [s for s in doc["sections"] if s["name"] == "layer-totals"]
    for row in section["rows"]:
        mine = [h for h in doc["heads"] if h["layer"] == row["layer"]]
        assert row["heads"] == 2 and row["sum_delta_loss"] == approx(sum(h["delta_loss"] for h in mine),
                                                                     dtype=torch.float64, width=2)
    read = Section.from_json(section)
    assert "Heads per layer: summed effect" in result.stdout and "Σ Δ loss [nats]" in result.stdout
    for cells in read.cells():
        assert all(cell in result.stdout for cell in cells)
    html = (tmp_path / "h.html").read_text()
    assert "<th><bdi>heads that matter</bdi></th>" in html
    for cells in read.cells():
        assert "".join(f"<td><bdi>{c}</bdi></td>" for c in cells) in html
    off = CliRunner().invoke(cli, args)
    assert off.exit_code == 0 and "layer-totals" not in [s["name"] for s in
                                                         json.loads((tmp_path / "h.json").read_text())["sections"]]
'''

SECTION = Recipe(
    "section", "a new analysis section in the CLI, the JSON and the report", ("analysis step",),
    (new("diagnose/ablation/layer_totals.py", SECTION_STEP),
     replace("diagnose/ablation/analyses.py", "BUILTINS: tuple[str, ...] = (",
             'BUILTINS: tuple[str, ...] = ("diagnose.ablation.layer_totals", '),
     insert("diagnose/ablation/config.py", "    layer_totals: bool = False", after="    direct: bool = True"),
     insert("diagnose/ablation/config.py", "    layer_totals: add the per-layer totals section (layer_totals.py).",
            after="`result.direct`, for families without a pre-norm residual stream."),
     insert("cli/heads.py", '@click.option("--layer-totals", is_flag=True, default=False,\n'
            '              help="Add a table of each layer\'s summed effect and the heads that matter.")',
            before="@html_option"),
     replace("cli/heads.py", "direct: bool, html_path: str | None) -> None:",
             "direct: bool, layer_totals: bool, html_path: str | None) -> None:"),
     replace("cli/heads.py", "direct=direct)", "direct=direct, layer_totals=layer_totals)"),
     new("tests/cli/test_layer_totals.py", SECTION_TEST),
     insert("docs/heads.md", "`--layer-totals` adds the section *Heads per layer: summed effect*: per layer, the "
            "summed Δ loss of its heads and how many matter.\n")),
    "tests/cli/test_layer_totals.py", guards=("tests/cli/test_heads_section.py",),
    note="4 without an option of its own (no `config.py`, no flag).")

RECIPES = [STATISTIC, ROLE, METHOD, SECTION]
