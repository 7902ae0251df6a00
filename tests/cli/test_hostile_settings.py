"""Hostile settings and inputs on the newest surfaces (issue 36), the cases tests/cli/test_hostile_surfaces.py
left: every AblationConfig field checked when made, `diagnose circuit` and `heads-over` judging --seed and
--draws before they load anything (as `diagnose heads` does), find_circuit refusing before any work, resample's
donor table checked against max_memory before the first forward, the shipped manifest refused through the real
`diagnose demo` command, make_models' --out guarded, the method agreement counted right when the page bounds it,
and rank 0's line about a dead peer. Refusals: exit 2 and one line naming the input (or one DiagnoseError line),
no traceback, the input unchanged, nothing allocated first."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from diagnose.errors import ConfigError, DiagnoseError, UsageError

from .hostile import assert_refused, invoke, rf, tree

pytestmark = pytest.mark.numerics

CONFIG = [("batch_size", 0), ("batch_size", 2.5), ("batch_size", "3"), ("batch_size", True), ("batch_size", 10 ** 30),
          ("top", "abc"), ("top", 2.5), ("top", True), ("n_boot", 0), ("n_boot", 10 ** 9), ("n_boot", "x"),
          ("keep", -1), ("keep", 10 ** 9), ("alpha", 0), ("alpha", 1), ("alpha", math.nan), ("alpha", "x"),
          ("min_effect", "x"), ("min_effect", math.inf), ("max_memory", "abc"), ("max_memory", True),
          ("max_memory", 10 ** 400), ("fast", "yes"), ("attention", "no"), ("reuse", 1), ("direct", "no"),
          ("distributed", "no"), ("together", "L0.H1"), ("together", [["ab"]]), ("together", 5),
          ("together", [[(0, -1)]]), ("method", ["zero"]), ("task", 5), ("correction", None)]


@pytest.mark.parametrize("name, value", CONFIG, ids=[f"{n}={v!r:.20}" for n, v in CONFIG])
def test_every_config_field_is_checked_when_made(name, value):
    from diagnose.ablation import AblationConfig

    with pytest.raises(ConfigError, match=name) as caught:
        AblationConfig(**{name: value})
    assert "\n" not in str(caught.value)


def test_fine_settings_are_kept_and_normalised():
    from diagnose.ablation import AblationConfig

    c = AblationConfig(batch_size=np.int64(4), top=np.int32(2), n_boot=100, alpha=np.float32(0.01), keep=0,
                       max_memory="1KB", together=[[[0, 1], (np.int64(1), 0)]], fast=np.bool_(True))
    assert (c.batch_size, c.top, c.max_memory, c.fast) == (4, 2, 1024, True) and type(c.batch_size) is int
    assert c.together == (((0, 1), (1, 0)),) and c.alpha == pytest.approx(0.01)


MISSING = ("m.pt", "--data", "d.pt")  # neither exists: a setting refused here was judged before loading
CLI = [("circuit a negative seed", ["circuit", *MISSING, "--seed", "-1"], "--seed"),
       ("circuit a seed over 2**63", ["circuit", *MISSING, "--seed", str(10 ** 23)], "--seed"),
       ("circuit draws zero ignores", ["circuit", *MISSING, "--draws", "3"], "--draws"),
       ("circuit draws zero,mean ignore", ["circuit", *MISSING, "--methods", "zero,mean", "--draws", "3"], "ignored"),
       ("circuit no draws", ["circuit", *MISSING, "--method", "resample", "--draws", "0"], "--draws"),
       ("circuit 10**9 draws", ["circuit", *MISSING, "--method", "resample", "--draws", str(10 ** 9)], "1000"),
       ("heads-over a negative seed", ["heads-over", "a.pt", "b.pt", "--data", "d.pt", "--seed", "-1"], "--seed"),
       ("heads draws 1 zero ignores", ["heads", *MISSING, "--draws", "1"], "would be ignored"),
       ("heads draws 0 for resample", ["heads", *MISSING, "--method", "resample", "--draws", "0"], "from 1 to 1000"),
       ("heads min-effect NaN", ["heads", *MISSING, "--min-effect", "nan"], "--min-effect must be a finite"),
       ("circuit faithfulness NaN", ["circuit", *MISSING, "--faithfulness", "nan"], "--faithfulness")]


@pytest.mark.parametrize("what, args, words", CLI, ids=[c[0] for c in CLI])
def test_commands_judge_seed_and_draws_before_loading(tmp_path, monkeypatch, what, args, words):
    monkeypatch.chdir(tmp_path)
    line = assert_refused(invoke(*args), words)
    assert "one draw" not in line and list(tmp_path.iterdir()) == []


def _tiny(n: int = 6):
    from diagnose.zoo import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=8))
    return model, {"input_ids": torch.randint(1, 12, (n, 5), generator=torch.Generator().manual_seed(0))}


def _forwards(model) -> list:
    calls: list = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


CIRCUIT = [("methods a string", dict(methods="zero,mean"), UsageError, "split"),
           ("methods numbers", dict(methods=[0, 1]), UsageError, "names"),
           ("a seed of -1", dict(seed=-1), ConfigError, "seed"),
           ("draws zero ignores", dict(draws=3), ConfigError, "ignored"),
           ("draws 2.5", dict(method="resample", draws=2.5), ConfigError, "whole number"),
           ("no bootstrap", dict(n_boot=0), ConfigError, "n_boot"),
           ("no resamples", dict(resamples=0), ConfigError, "resamples"),
           ("alpha a string", dict(alpha="0.05"), ConfigError, "alpha"),
           ("top 2.5", dict(top=2.5), ConfigError, "top"),
           ("faithfulness a string", dict(faithfulness="0.8"), ConfigError, "faithfulness")]


@pytest.mark.parametrize("what, kw, error, words", CIRCUIT, ids=[c[0] for c in CIRCUIT])
def test_find_circuit_refuses_before_any_forward(what, kw, error, words):
    from diagnose.circuit import find_circuit

    model, data = _tiny()
    calls = _forwards(model)
    with pytest.raises(error, match=words):
        find_circuit(model, data, task="lm", **kw)
    assert calls == []


def test_a_donor_table_over_max_memory_is_refused_before_the_first_forward():
    from diagnose.ablation import ablate_heads

    model, data = _tiny(60)
    calls = _forwards(model)
    with pytest.raises(ConfigError, match=r"donor table for 60 examples x 1000 draws needs 469 KB, more than "
                                          r"max_memory \(100 KB\); lower --draws or raise --max-memory"):
        ablate_heads(model, data, task="lm", method="resample", draws=1000, max_memory="100KB", progress=False)
    assert calls == []


# ---- the shipped manifest, through `diagnose demo` ----------------------------------------------

def _weights(path):
    return lambda e, d: e.update(weights=path)


DEMO = [("weights outside the package", _weights("/etc/passwd"), "not a path inside"),
        ("the entry a list", lambda e, d: d["models"].update(induction=[1]), "`files`"),
        ("weights not hashed", lambda e, d: e["files"].pop(e["weights"]), "no sha256"),
        ("a hashed file changed", None, "missing or changed")]


@pytest.mark.parametrize("what, edit, words", DEMO, ids=[c[0] for c in DEMO])
def test_demo_refuses_a_tampered_manifest_in_one_line(tmp_path, monkeypatch, what, edit, words):
    from diagnose.demo import _shipped

    models = tmp_path / "models"
    shutil.copytree(_shipped.MODELS_DIR, models)
    data = json.loads((models / "manifest.json").read_text())
    if edit is None:
        with open(models / data["models"]["induction"]["weights"], "ab") as f:
            f.write(b"\0")
    else:
        edit(data["models"]["induction"], data)
        (models / "manifest.json").write_text(json.dumps(data))
    before = tree(models)
    monkeypatch.setattr(_shipped, "MODELS_DIR", models)
    assert_refused(invoke("demo", "--no-lessons", "--out", tmp_path / "out"), words, fix="reinstall diagnose")
    assert tree(models) == before


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_demo_refuses_a_manifest_that_is_no_regular_file(tmp_path, monkeypatch, kind):
    from diagnose.demo import _shipped

    models = tmp_path / "models"
    shutil.copytree(_shipped.MODELS_DIR, models)
    (models / "manifest.json").unlink()
    os.mkfifo(models / "manifest.json") if kind == "fifo" else (models / "manifest.json").symlink_to("/dev/zero")
    monkeypatch.setattr(_shipped, "MODELS_DIR", models)
    assert_refused(invoke("demo", "--no-lessons", "--out", tmp_path / "out"), "manifest.json")


OUT = [("a dangling symlink", lambda p: p.symlink_to(p.parent / "gone"), "does not exist"),
       ("a FIFO", os.mkfifo, "named pipe"),
       ("under a file", lambda p: p.parent.joinpath("file").write_text("mine"), "Not a directory")]


@pytest.mark.parametrize("what, make, words", OUT, ids=[c[0] for c in OUT])
def test_make_models_out_is_guarded(tmp_path, capsys, what, make, words):
    from diagnose.demo import make_models

    out = tmp_path / "out"
    make(out)
    target = tmp_path / "file" / "sub" if what == "under a file" else out
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as caught:
        make_models.main(["--out", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---- the method agreement, bounded and counted --------------------------------------------------

def _agreement(n: int) -> dict:
    rows = [{"layer": h // 64, "head": h % 64, "agree": False, "verdicts": {"zero": "matters", "mean": "negligible"}}
            for h in range(n)]
    pairs = [[r["layer"], r["head"]] for r in rows]
    return {"methods": ["zero", "mean"], "heads": rows, "depends": pairs, "contradicts": pairs, "n_compared": n,
            "n_depends": n}


def test_the_summary_counts_every_head_the_bounded_page_stands_for():
    import copy

    from diagnose.reports._summary import heads_verdict
    from diagnose.reports.view_heads import MAX_LISTED, heads_view

    doc = copy.deepcopy(rf.make_heads())
    doc["agreement"] = _agreement(3_000)
    view = heads_view("h", doc)
    assert (view.n_depends, len(view.depends)) == (3_000, MAX_LISTED + 1)
    line = dict(heads_verdict(view).lines)["Depends on the method"]
    assert "for 3,000 head(s)" in line and "and 2,994 more." in line


def test_the_terminal_names_a_bounded_number_of_contradicting_heads():
    from rich.console import Console

    from diagnose.cli.heads import SHOWN_CONTRADICTS, _print_agreement

    out = Console(record=True, width=100_000)
    _print_agreement(out, _agreement(3_000))
    text = out.export_text()
    assert text.count("(zero: matters, mean: negligible)") == SHOWN_CONTRADICTS
    assert f"and {3_000 - SHOWN_CONTRADICTS:,} more (agreement.contradicts in the JSON)" in text


def test_rank_zero_says_gloo_s_first_sentence_when_a_peer_died(monkeypatch):
    """What gloo raises on rank 0 when rank 1 was killed mid-collective (seen on torch 2.13, CPU)."""
    def dead(*_a, **_k):
        raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                           "[127.0.0.1]:48327. This is typically caused by a remote worker crashing. Check the logs")
    monkeypatch.setattr("diagnose.io.load_model", dead)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    line = assert_refused(invoke("info", "m.pt"), "another torchrun process exited")
    assert "(RuntimeError: Connection closed by peer [127.0.0.1]:48327)" in line and "pair.cc" not in line


CORRELATIONS = [("rho", 10 ** 400, (math.inf, 0.5, 10)), ("p_value", -(10 ** 400), (0.25, -math.inf, 10)),
                ("n", "x", (0.25, 0.5, 0)), ("n", [[1]], (0.25, 0.5, 0)), ("n", 2 ** 70, (0.25, 0.5, 0)),
                ("rho", True, None)]


@pytest.mark.parametrize("key, value, expected", CORRELATIONS, ids=[f"{k}={v!r:.12}" for k, v, _ in CORRELATIONS])
def test_a_dict_source_s_correlations_are_read_as_bounded_numbers(key, value, expected):
    import copy

    from diagnose.reports.view_heads import heads_view

    doc = copy.deepcopy(rf.make_heads())
    doc["correlations"]["entropy"] = {"rho": 0.25, "p_value": 0.5, "n": 10, key: value}
    got = {c.statistic: (c.rho, c.p_value, c.n) for c in heads_view("h", doc).correlations}
    assert got.get("entropy") == expected  # a bool is no number: the row is left out


@pytest.mark.parametrize("key, value", [("layer", 10 ** 400), ("layer", True), ("head", 99), ("head", -1)])
def test_a_flag_on_no_head_of_the_model_is_one_line(key, value):
    import copy

    from diagnose.reports._sources import load_sources

    doc = copy.deepcopy(rf.make_heads())
    doc["flags"][0][key] = value
    with pytest.raises(DiagnoseError, match=rf"source 1 \(dict\): flags\[0\]\.{key}") as caught:
        load_sources([doc])
    assert "\n" not in str(caught.value)


def test_an_example_map_of_400_digit_numbers_is_one_line():
    import copy

    from diagnose.reports.view_heads import heads_view

    doc = copy.deepcopy(rf.make_heads())
    doc["examples"][0]["attention"][0][0][0][0] = 10 ** 400
    with pytest.raises(DiagnoseError, match=r"examples\[0\] needs `tokens`") as caught:
        heads_view("h", doc)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("shared", [10 ** 400, True, "x", [{"module": "m", "applications": 2, "layers": 5}]])
def test_a_model_s_shared_layers_of_the_wrong_type_say_nothing(shared):
    from diagnose.reports.view_heads import shared_note

    assert shared_note({"shared": shared}) == ""


SECTIONS = [("a column without a key", {"columns": [{"label": "x"}], "rows": []}, "malformed"),
            ("300k rows", {"columns": [{"key": "a"}], "rows": [{"a": 1}] * 300_000}, "300,000 rows")]


@pytest.mark.parametrize("what, part, words", SECTIONS, ids=[c[0] for c in SECTIONS])
def test_a_source_s_analysis_section_is_checked_and_bounded(what, part, words):
    import copy

    from diagnose.reports._sources import load_sources

    doc = copy.deepcopy(rf.make_heads())
    doc["sections"] = [{"name": "s", "title": "t", **part}]
    with pytest.raises(DiagnoseError, match=words) as caught:
        load_sources([doc])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key, value", [("heads", 5), ("sections", True), ("circuit.methods", "x")])
def test_a_circuit_document_s_lists_and_methods_are_checked(key, value):
    import json as _json

    from diagnose.reports._sources import load_sources

    doc = {"schema": "diagnose.circuit/1", "model": {"heads": [2, 2]}, "edges": [], "circuit": {"edges": []}}
    where = doc["circuit"] if key == "circuit.methods" else doc
    where[key.split(".")[-1]] = value
    with pytest.raises(DiagnoseError, match=f"`{key}`") as caught:
        load_sources([_json.loads(_json.dumps(doc))])
    assert "\n" not in str(caught.value)


LONG = [("a method name of 30,000 letters", ["--methods", "zero," + "q" * 30_000]),
        ("3,000 copies of one method", ["--methods", "zero," * 3_000]),
        ("3,000 heads and a typo", ["--together", "L0.H0," * 3_000 + "x"])]


@pytest.mark.parametrize("what, args", LONG, ids=[c[0] for c in LONG])
def test_a_refusal_quoting_a_long_value_stays_one_short_line(what, args):
    assert len(assert_refused(invoke("heads", *MISSING, *args))) < 300
