"""tools/change_cost.py (`make change-cost`) cannot rot: every plug-in point of docs/development.md's table
has a recipe, every recipe still applies to this tree (its anchors are where it edits) within 6 files, the
docs' change-cost table lists every recipe, and one recipe runs end to end in a copy."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# plug-in points whose entries no typical change of issue 30 adds: a folder kind is written by the part that
# saves such a folder (prune's pruned folders), and comes with that part
NO_TYPICAL_CHANGE = {"folder kind"}


def _tool():
    spec = importlib.util.spec_from_file_location("change_cost", ROOT / "tools" / "change_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("change_cost", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _tables(start: str, stop: str | None = None) -> list[list[list[str]]]:
    """The markdown tables (rows of cells, header and rule left out) from the line starting with `start` to the
    one starting with `stop` (or the first table's end)."""
    lines = (ROOT / "docs" / "development.md").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(start))
    tables, rows = [], None
    for line in lines[at:]:
        if stop is not None and line.startswith(stop):
            break
        if line.startswith("|"):
            if rows is None:
                rows = []
            elif not line.startswith("| ---"):
                rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows is not None:
            tables.append(rows)
            rows = None
            if stop is None:
                break
    return tables + ([rows] if rows else [])


def test_every_plug_in_point_has_a_recipe():
    tables = _tables("### Plug-in points", stop="| change | files | result | the files |")
    points = {row[0] for table in tables for row in table}
    assert {"per-head attention statistic", "monitor measurement", "output sink"} <= points  # both tables read
    recipes = _tool().recipes()
    covered = {p for r in recipes for p in r.points}
    assert points - NO_TYPICAL_CHANGE <= covered, sorted(points - NO_TYPICAL_CHANGE - covered)
    here = {p for r in recipes if all((ROOT / n).exists() for n in r.needs) for p in r.points}  # its API is here
    assert here <= points, sorted(here - points)  # a recipe names a row that exists


def test_the_docs_table_is_the_script_s():
    assert "`make change-cost`" in (ROOT / "docs" / "development.md").read_text()
    (rows,) = _tables("| change | files | result | the files |")
    listed = [row[0] for row in rows]
    assert listed == [r.change for r in _tool().recipes()]


def test_every_recipe_still_applies_within_six_files(tmp_path):
    tool = _tool()
    copy = tmp_path / "repo"
    tool.copy_repository(ROOT, copy)
    applicable = [r for r in tool.recipes() if all((copy / p).exists() for p in r.needs)]
    assert {r.name for r in applicable} == {r.name for r in tool.recipes()}  # every API they need is in the tree
    counts = {}
    for recipe in applicable:
        for edit in recipe.edits:
            edit(copy)  # RecipeRot: the code moved under the recipe
        counts[recipe.name] = tool.changed_files(copy)
        tool.reset(copy)
        assert tool.changed_files(copy) == []
    assert all(recipe.test in counts[recipe.name] for recipe in applicable)
    assert {name: len(files) for name, files in counts.items() if len(files) > 6} == {}


@pytest.mark.slow
def test_two_recipes_run_in_a_copy_and_pass():
    """One on the heads' side and one on the monitor's, whose test trains under the monitor's defaults and
    renders the report: when the monitor's default `every` went from 1 to 10, the four monitor recipes' tests
    failed (they read every step) and nothing here ran them."""
    # the policy scans already pass on this tree (the suite runs them), so the baseline run is skipped
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "change_cost.py"), "--only", "method", "--only",
                          "monitor-alert", "--no-baseline"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| a new ")}
    assert re.search(r"\| 3 \| pass \|", rows["a new ablation method such as resample"])
    assert "`tests/ablation/test_halve.py`" in rows["a new ablation method such as resample"]
    assert re.search(r"\| 5 \| pass \|", rows["a new monitor alert on a new measurement"])
