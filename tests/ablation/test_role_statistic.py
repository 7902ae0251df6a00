"""A role-like statistic is one registry entry: registered with a `role`, heads are clustered on it and
named by it (roles.py), contrast calls a head striking for it and says so in words, and the CLI's table,
the report's tables and its role grid's key name it; unregistered, it is gone from all of them."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from diagnose.ablation import contrast, roles
from diagnose.ablation.result import HeadsResult
from diagnose.cli.heads import _table
from diagnose.errors import ConfigError
from diagnose.reports import render_html
from diagnose.reports._plots_heads import role_key
from diagnose.reports.view_heads import heads_view
from diagnose.statistics import STATISTICS, Role, Statistic, register, role_label, unregister

from .test_contrast import head

TWO_BACK = Statistic("two_back", "mass two tokens back", "two back", lambda c: c.at(c.q_pos - 2),
                     role=Role("two back", "2", "two tokens back"))


@pytest.fixture
def two_back():
    register(TWO_BACK)
    try:
        yield TWO_BACK
    finally:
        unregister(TWO_BACK.name)


def _heads(kinds, share=0.75):
    """Three heads of each kind, most of their weight where the kind says (a broad head nowhere)."""
    rng = np.random.default_rng(0)
    out = []
    for i, kind in enumerate(kinds * 3):
        att = {k: 0.0 for k in roles.names() if k != "broad"}
        if kind != "broad":
            att[kind] = share + 0.05 * rng.random()
        att["local"] = att["prev_token"] + att["next_token"] + att.get("two_back", 0.0)
        out.append(head(i // len(kinds), i % len(kinds), dacc=0.0, dloss=0.0, p=1.0, att=att))
    return out


def test_a_registered_role_names_heads_in_the_engine_the_cli_and_the_report(two_back):
    kinds = ["two_back", "prev_token", "first_token", "broad"]
    assert roles.names()[-2:] == ["two_back", "broad"]  # clustered on, after the shipped roles
    heads = _heads(kinds)
    roles.assign(heads)
    assert [h.role for h in heads] == kinds * 3

    lone = [head(1, i, dacc=0.0, dloss=0.0, p=1.0, att={"two_back": 0.1, "max_weight": 0.3}) for i in range(8)]
    lone.append(head(2, 0, dacc=0.0, dloss=0.0, p=1.0, att={"two_back": 0.95, "max_weight": 0.95}))  # striking
    for h in lone:
        h.negligible = True
    flag = next(f for f in contrast.flags(lone, 1.0) if (f["layer"], f["head"]) == (2, 0))
    assert flag["kind"] == "striking_but_inert" and "95% of its attention goes two tokens back" in flag["reason"]

    result = HeadsResult({"family": "toy", "n_layers": 3, "n_heads": 4}, "lm", "zero", 10, 10,
                         {"accuracy": 1.0, "loss": 1.0}, heads, {}, [{**flag, "layer": 0, "head": 0}], {}, {})
    console = Console(record=True, width=240)
    console.print(_table(result, "Holm"))
    printed = console.export_text()
    assert printed.count("two back") == 3 and "previous token" in printed  # the role column, in the registry's words

    doc = result.to_json()
    view = heads_view("toy", doc)
    assert [r.role for r in view.layers()[0].rows] == ["two back", "previous token", "first token", "broad"]
    assert role_key()["two_back"] == ("2", "two back")
    html = render_html(doc)
    assert "<td><bdi>two back</bdi></td>" in html  # the flagged head's role cell


def test_unregistered_the_role_is_gone_and_an_old_name_still_reads(two_back):
    unregister(TWO_BACK.name)
    try:
        assert "two_back" not in roles.names() and "two_back" not in role_key()
        assert "two_back" not in contrast._phrases()
        assert role_label("two_back") == "two back"  # a file from a registry that had it: its name in words
    finally:
        register(TWO_BACK)  # the fixture unregisters it


def test_a_role_must_say_itself_apart():
    with pytest.raises(ConfigError, match="clashes"):
        register(Statistic("x", "x", "x", lambda c: c.zeros(), role=Role("y", "P")))  # P: previous token's
    with pytest.raises(ConfigError, match="names no role"):
        register(Statistic("x", "x", "x", lambda c: c.zeros(), role=Role("y", "Y", within=("entropy",))))
    with pytest.raises(ConfigError, match="one character"):
        Role("y", "YY")
    with pytest.raises(ConfigError, match="not registered"):
        unregister("x")
    assert "x" not in STATISTICS
