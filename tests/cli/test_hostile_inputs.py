"""Hostile and broken inputs through the CLI (issue 13, the reading side).

Every case ends with exit code 2 and one line on stderr that names the file and a fix:
no traceback, no hang, no prompt, no code from a model folder run, nothing written.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import diagnose
from diagnose._head_label import head_label
from diagnose.zoo import ModelConfig, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
import report_fixtures as rf  # noqa: E402

from .hostile import (  # noqa: E402
    FACTORY_EMB, assert_refused, edit_info, edit_record, invoke, jsonl, npz_bomb, own_code_folder, pickles,
    run_folder, special, special_in_run, tree,
)

pytestmark = pytest.mark.numerics


# --- code that must not run --------------------------------------------------------------


def test_own_code_folder_refused_without_prompt_or_running_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-home" / "modules"))
    folder, marker = own_code_folder(tmp_path)
    before = tree(folder)
    res = invoke("info", folder, input="y\n" * 20)  # a user who would answer yes to any prompt
    line = assert_refused(res, folder, "evilnet", fix="--factory")
    assert "built-in" in line
    assert "custom code" not in res.output and "[y/N]" not in res.output
    assert not marker.exists(), "a file of the model folder ran"
    assert not (tmp_path / "hf-home" / "modules").exists()
    assert tree(folder) == before


@pytest.mark.slow
def test_builtin_family_with_auto_map_loads_the_builtin_class_and_runs_nothing(tmp_path, monkeypatch):
    """A known model_type with an auto_map: the built-in class is used, the folder's code never imported."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ..wordlevel import make_tokenizer

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    base = tmp_path / "base"
    GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=8)).save_pretrained(base)
    make_tokenizer().save_pretrained(base)
    folder, marker = own_code_folder(tmp_path, model_type="gpt2", base=base)
    res = invoke("info", folder, input="y\n" * 20)
    assert "[y/N]" not in res.output
    assert not marker.exists(), "a file of the model folder ran"
    assert not (tmp_path / "modules").exists()
    assert res.exit_code == 0, res.output
    assert "transformers.models.gpt2" in res.output


@pytest.mark.slow
def test_own_code_folder_in_a_real_process_with_yes_on_stdin(tmp_path):
    """What the issue saw: `yes | diagnose info FOLDER` ran the folder's code. Now: refused."""
    folder, marker = own_code_folder(tmp_path)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "home" / "hf")}
    env.pop("HF_MODULES_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "diagnose", "info", str(folder)], input="y\n" * 50,
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and str(folder) in proc.stderr, proc.stderr
    assert "[y/N]" not in proc.stdout + proc.stderr
    assert not marker.exists()
    assert not list((tmp_path / "home").rglob("modules"))


def test_hf_loader_passes_trust_remote_code_false_everywhere():
    """Every from_pretrained in the package says trust_remote_code=False (a grep, so new calls count too)."""
    root = Path(diagnose.__file__).resolve().parent
    calls = []
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ".from_pretrained(" in line and not line.lstrip().startswith("#"):
                calls.append((path.name, n, line))
    assert calls, "no from_pretrained found: the test looks in the wrong place"
    for name, n, line in calls:
        assert "trust_remote_code=False" in line or "**kwargs" in line, f"{name}:{n}: {line.strip()}"
    hf = (root / "io" / "_hf.py").read_text()
    assert '"trust_remote_code": False' in hf


# --- checkpoints ----------------------------------------------------------------------------

def _edit_checkpoint(src: Path, dst: Path, **changes) -> Path:
    obj = torch.load(src, weights_only=True)
    for key, value in changes.items():
        if key == "meta":
            obj["meta"] = value
        else:
            obj["config"][key] = value
    torch.save(obj, dst)
    return dst


@pytest.mark.parametrize("changes,words", [
    ({"n_layers": 10**9}, "n_layers=1000000000"),
    ({"n_layers": math.inf}, "n_layers must be an integer"),
    ({"n_heads": 0}, "n_heads must be at least 1"),
    ({"d_model": -16}, "d_model must be at least 1"),
    ({"d_ff": 10**9}, "d_ff=1000000000"),
    ({"max_len": 10**12}, "max_len=1000000000000"),
    ({"vocab_size": 10**10}, "vocab_size=10000000000"),
    ({"dropout": math.nan}, "dropout must be a finite number"),
    ({"positions": ["learned"]}, "positions=['learned']"),
    ({"meta": [1, 2]}, "meta is a list"),
    ({"meta": "x"}, "meta is a str"),
], ids=lambda v: str(v)[:30])
def test_damaged_checkpoint_config_one_line_before_building(files, changes, words, monkeypatch):
    bad = _edit_checkpoint(files / "model.pt", files / "bad.pt", **changes)

    def built(self, *args, **kwargs):
        raise AssertionError("the model was built before the config was checked")

    monkeypatch.setattr(Transformer, "__init__", built)
    res = invoke("info", bad)
    assert_refused(res, bad, words, fix="diagnose.save_checkpoint")


def test_checkpoint_state_dict_not_tensors(files):
    obj = torch.load(files / "model.pt", weights_only=True)
    obj["state_dict"] = {"tok_emb.weight": [1, 2]}
    torch.save(obj, files / "bad.pt")
    assert_refused(invoke("info", "bad.pt"), "bad.pt", "state_dict", fix="save_checkpoint")


# --- pickles --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zip", "raw", "proto0"])
def test_malicious_pickle_refused_naming_trust_pickle_not_torch_advice(files, kind):
    path = pickles(files)[kind]
    line = assert_refused(invoke("info", path), path, fix="--trust-pickle")
    assert "weights_only" not in line and "Re-running" not in line
    assert not (files / "PWNED").exists()


def test_factory_with_trust_pickle_is_not_told_to_pass_trust_pickle(files):
    (files / "fac_hostile.py").write_text("import torch.nn as nn\ndef build():\n    return nn.Linear(2, 2)\n")
    weird = files / "weird.pt"  # a state_dict pickled with a class of its own
    torch.save({"weight": torch.zeros(2, 2), "bias": torch.zeros(2), "extra": _HolderLike()}, weird)
    res = invoke("info", weird, "--factory", "fac_hostile:build")
    assert_refused(res, weird, fix="--trust-pickle")
    res = invoke("info", weird, "--factory", "fac_hostile:build", "--trust-pickle")
    line = assert_refused(res, weird)
    assert "--trust-pickle" not in line
    sys.modules.pop("fac_hostile", None)


class _HolderLike:
    pass


# --- special files: read only regular files --------------------------------------------------


@pytest.mark.parametrize("kind,words", [("fifo", "named pipe"), ("devzero", "character device")])
@pytest.mark.parametrize("role", ["model", "data", "factory-weights"])
def test_fifo_or_device_as_model_or_data_is_not_called_a_folder(files, kind, words, role):
    (files / "fac_special.py").write_text("import torch.nn as nn\ndef build():\n    return nn.Linear(2, 2)\n")
    name = {"model": "m.pt", "data": "d.pt", "factory-weights": "w.safetensors"}[role]
    path = special(files, kind, name)
    args = {"model": ["info", path], "data": ["info", "model.pt", "--data", path],
            "factory-weights": ["info", path, "--factory", "fac_special:build"]}[role]
    line = assert_refused(invoke(*args), path, words, fix="regular file")
    assert "folder" not in line
    sys.modules.pop("fac_special", None)


@pytest.mark.parametrize("kind,words", [("fifo", "named pipe"), ("devzero", "character device")])
@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json"])
def test_special_file_inside_a_model_folder(tmp_path, kind, words, name):
    """transformers would open a FIFO inside the folder and wait forever."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ..wordlevel import make_tokenizer

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=8)).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    (folder / name).unlink()
    path = special(folder, kind, name)
    assert_refused(invoke("info", folder), path, words)


@pytest.mark.slow
def test_special_files_time_out_never(files):
    """A FIFO with no writer would block open() forever: refused within seconds, in a real process."""
    fifo = special(files, "fifo", "pipe.jsonl")
    proc = subprocess.run([sys.executable, "-m", "diagnose", "info", "model.pt", "--data", str(fifo)],
                          capture_output=True, text=True, timeout=60, cwd=files)
    assert proc.returncode == 2 and "named pipe" in proc.stderr, proc.stderr


# --- data files -------------------------------------------------------------------------------


DATA_CASES = [
    # name, make(tmp) -> path, words in the message
    ("npz declaring 1e12 elements", lambda t: npz_bomb(t / "b.npz", (10**6, 10**6), 100), "declares"),
    ("npz declaring 8 GB in 8 MB", lambda t: npz_bomb(t / "b.npz", (1 << 20, 1 << 10), 8 << 20), "declares"),
    ("jsonl nested 1e5 deep", lambda t: jsonl(t / "d.jsonl", ['{"text": "a", "x": ' + "[" * 100_000 + "]" * 100_000
                                                               + "}"]), "nested too deeply"),
    ("jsonl label 10**30", lambda t: jsonl(t / "d.jsonl", [{"text": "the cat", "label": 10**30}]), "label"),
    ("jsonl label 1e300", lambda t: jsonl(t / "d.jsonl", [{"text": "the cat", "label": 1e300}]), "label"),
    ("jsonl label of 5000 digits", lambda t: jsonl(t / "d.jsonl", ['{"text": "a", "label": ' + "9" * 5000 + "}"]),
     "line 1"),
]


@pytest.mark.parametrize("name,make,words", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_hostile_data_files_one_line(files, hf_folder, name, make, words):
    path = make(files)
    model = hf_folder if path.suffix == ".jsonl" else "model.pt"
    res = invoke("info", model, "--data", path)
    assert_refused(res, path, words)


def test_npz_over_the_size_limit_refused_before_reading(files, monkeypatch):
    from diagnose.io import _data as data_mod

    np.savez(files / "big.npz", input_ids=np.ones((64, 8), dtype=np.int64))
    monkeypatch.setattr(data_mod, "MAX_DATA_BYTES", 1024)
    assert_refused(invoke("info", "model.pt", "--data", "big.npz"), "big.npz", "split it")


def test_jsonl_with_u2028_inside_a_string_is_valid(files, hf_folder):
    path = jsonl(files / "d.jsonl", ['{"text": "the cat\u2028sat", "label": 0}', {"text": "a dog ran", "label": 1}])
    res = invoke("info", hf_folder, "--data", path)
    assert res.exit_code == 0, res.output
    assert "N=2" in res.output


def test_huge_jsonl_line_is_cut_to_the_models_length_before_tokenising(files, hf_folder, monkeypatch):
    """A 20 MB example costs what 16 tokens cost: default --max-length is max_position_embeddings,
    and the tokenizer is handed at most what 16 tokens can take, never the whole line."""
    from transformers import PreTrainedTokenizerBase

    from diagnose.io import _text

    big = " ".join(["the cat sat on the mat"] * 700_000)  # ~15.4 MB of text
    path = jsonl(files / "d.jsonl", [{"text": big, "label": 0}, {"text": "a dog", "label": 1}])
    given, real = [], PreTrainedTokenizerBase.__call__

    def call(self, text=None, *args, **kwargs):
        given.extend(len(t) for t in ([text] if isinstance(text, str) else text or []))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", call)
    res = invoke("info", hf_folder, "--data", path)
    assert res.exit_code == 0, res.output
    assert "T=16" in res.output
    assert given and max(given) <= 16 * _text._CHARS_PER_TOKEN


def test_jsonl_line_over_the_cap_refused_without_reading_it_whole(files, hf_folder, monkeypatch):
    from diagnose.io import _text as text

    monkeypatch.setattr(text, "MAX_LINE_BYTES", 1000)
    path = jsonl(files / "d.jsonl", [{"text": "a dog", "label": 1}, {"text": "the cat " * 200, "label": 0}])
    assert_refused(invoke("info", hf_folder, "--data", path), path, "line 2", fix="split or shorten")


def test_cut_text_encodes_as_the_whole_text_does(hf_folder):
    """Cutting before tokenising changes nothing the model sees (truncated to max_length either way)."""
    from diagnose.io._text import _tokenise
    from ..wordlevel import make_tokenizer

    tok = make_tokenizer()
    texts = ["the cat sat " * 50, "a " + "x" * 5000 + " dog ran", "big red dog"]
    pairs = ["a dog " * 300, "red", "cat " + "y" * 3000]
    for limit in (4, 8, 16):
        got = _tokenise(tok, texts, None, limit)["input_ids"]
        want = tok(texts, truncation=True, max_length=limit)["input_ids"]
        assert [list(r) for r in got] == [list(r) for r in want]
        got = _tokenise(tok, texts, pairs, limit)
        want = tok(texts, text_pair=pairs, truncation=True, max_length=limit)
        for key in ("input_ids", "token_type_ids"):
            assert [list(r) for r in got[key]] == [list(r) for r in want[key]], (limit, key)


def test_lm_data_with_one_token_per_example(files):
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=16))
    diagnose.save_checkpoint(lm, files / "lm.pt")
    torch.save({"input_ids": torch.randint(0, 12, (6, 1))}, files / "t1.pt")  # [N, T=1]
    assert_refused(invoke("heads", "lm.pt", "--data", "t1.pt"), "t1.pt", "two tokens")


def test_token_id_out_of_range_after_the_first_examples_of_a_factory_model(files):
    """The vocabulary of a --factory model is not in any config: found before the sweep, not mid-way."""
    (files / "fac_vocab.py").write_text(FACTORY_EMB)
    sys.path.insert(0, str(files))
    try:
        import fac_vocab

        torch.save(fac_vocab.build().state_dict(), files / "w.pt")
    finally:
        sys.path.remove(str(files))
        sys.modules.pop("fac_vocab", None)
    ids = torch.randint(0, 12, (10, 6))  # [N, T]
    ids[7, 3] = 40  # beyond the 12-token vocabulary, in the 8th example
    torch.save({"input_ids": ids, "labels": torch.arange(10) % 3}, files / "oov.pt")
    res = invoke("heads", "w.pt", "--factory", "fac_vocab:build", "--data", "oov.pt")
    assert_refused(res, "oov.pt", "example 7", fix="tokenise")
    sys.modules.pop("fac_vocab", None)


# --- run folders ------------------------------------------------------------------------------


RUN_CASES = [
    ("model a string", edit_info(model="gpt"), "run.json", "`model` is a string"),
    ("sessions a dict", edit_info(sessions={"a": 1}), "run.json", "`sessions`"),
    ("run.json a list", lambda r: (r / "run.json").write_text("[1]"), "run.json", "schema"),
    ("run.json nested 1e5", lambda r: (r / "run.json").write_text("[" * 100_000 + "]" * 100_000), "run.json",
     "nested too deeply"),
    ("layers a list", edit_record(3, layers=[1, 2]), "metrics.jsonl, line 4", "`layers` is a list"),
    ("entropy a string", edit_record(5, entropy="high"), "metrics.jsonl, line 6", "entropy"),
    ("lr a string", edit_record(2, lr="1e-3"), "metrics.jsonl, line 3", "`lr` is a string"),
    ("step a string", edit_record(2, step="3"), "metrics.jsonl, line 3", "`step`"),
    ("metrics.jsonl a folder", special_in_run("metrics.jsonl", "folder"), "metrics.jsonl", "folder"),
    ("metrics.jsonl a FIFO", special_in_run("metrics.jsonl", "fifo"), "metrics.jsonl", "named pipe"),
    ("metrics.jsonl -> /dev/zero", special_in_run("metrics.jsonl", "devzero"), "metrics.jsonl", "character device"),
    ("run.json a FIFO", special_in_run("run.json", "fifo"), "run.json", "named pipe"),
    ("alerts.jsonl -> /dev/zero", special_in_run("alerts.jsonl", "devzero"), "alerts.jsonl", "character device"),
]


@pytest.mark.parametrize("command", ["stats", "report"])
@pytest.mark.parametrize("name,edit,file,words", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_broken_run_folders_one_line(tmp_path, command, name, edit, file, words):
    run = run_folder(tmp_path, edit)
    args = ["stats", run] if command == "stats" else ["report", run, "-o", tmp_path / "r.html"]
    assert_refused(invoke(*args), file, words)
    assert not (tmp_path / "r.html").exists()


def test_unreadable_metrics(tmp_path, monkeypatch):
    """chmod 000 does not stop root, so the refusal open() gives is simulated for that one file."""
    import builtins

    run = run_folder(tmp_path, lambda r: None)
    real_open = builtins.open

    def deny(path, *args, **kwargs):
        if str(path).endswith("metrics.jsonl"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("diagnose.io._read.open", deny, raising=False)
    assert_refused(invoke("stats", run), "metrics.jsonl", "Permission denied", fix="permissions")


def test_string_lr_in_check_run(files):
    run = run_folder(files, edit_record(1, lr="fast"))
    assert_refused(invoke("check", "model.pt", "--run", run), "metrics.jsonl, line 2", "`lr` is a string")


# --- report sources ---------------------------------------------------------------------------

def _heads_doc(edit) -> dict:
    doc = rf.make_heads(n_kept=1)
    edit(doc)
    return doc


def _set(**changes):
    return lambda d: d.update(changes)


def _set_head(i, **changes):
    return lambda d: d["heads"][i].update(changes)


REPORT_CASES = [
    ("attention a string", _set_head(0, attention="x"), "heads[0].attention"),
    ("timing a list", _set(timing=[1]), "`timing` is a list"),
    ("baseline a string", _set(baseline="x"), "`baseline` is a string"),
    ("together unhashable", _set(together=[{"heads": [[[0], [1]], [{"a": 1}, 2]], "accuracy": 0.5}]), "together[0]"),
    ("declared 1e6 x 1e6 grid", lambda d: d["model"].update(n_layers=10**6, n_heads=10**6), "1000000 x 1000000"),
    ("delta a huge int", _set_head(1, delta_loss=10**400), "heads[1].delta_loss"),
    ("layer a bool", _set_head(0, layer=True), "heads[0]"),
    ("significant a string", _set_head(0, significant="yes"), "heads[0].significant"),
    ("flags a string", _set(flags="x"), "`flags` is a string"),
]


@pytest.mark.parametrize("name,edit,words", REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_broken_heads_json_one_line_nothing_written(tmp_path, name, edit, words):
    src = tmp_path / "heads.json"
    src.write_text(json.dumps(_heads_doc(edit)))
    out = tmp_path / "r.html"
    assert_refused(invoke("report", src, "-o", out), src, words, fix="diagnose heads")
    assert not out.exists()


def test_heads_json_nested_deep_and_lessons_template(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "diagnose.heads/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_refused(invoke("report", deep, "-o", tmp_path / "r.html"), deep, "nested too deeply")
    lessons = tmp_path / "lessons.json"
    lessons.write_text(json.dumps({"schema": "diagnose.lessons/1", "lessons": [
        {"title": "t", "claim": "c", "a": "a", "b": "b",
         "rows": [{"metric": "m", "a": 1.0, "b": 2.0, "fmt": "{0.__class__}"}]}]}))
    assert_refused(invoke("report", lessons, "-o", tmp_path / "r.html"), lessons, "fmt")


def test_report_source_fifo_and_devzero(tmp_path):
    for kind, words in (("fifo", "named pipe"), ("devzero", "character device")):
        path = special(tmp_path, kind, f"{kind}.json")
        assert_refused(invoke("report", path, "-o", tmp_path / "r.html"), path, words)


@pytest.mark.slow
@pytest.mark.parametrize("only_layer_head", [True, False])
def test_heads_with_nothing_finite_render(tmp_path, only_layer_head):
    """Only layer/head, or NaN/Inf everywhere: a report without grids, not a ZeroDivisionError."""
    doc = rf.make_heads(n_kept=0)
    doc["examples"] = []
    for h in doc["heads"]:
        if only_layer_head:
            for key in list(h):
                if key not in ("layer", "head"):
                    del h[key]
        else:
            for key in ("accuracy", "delta_accuracy", "loss", "delta_loss", "kl", "grad_importance", "p_value"):
                h[key] = math.nan if key != "delta_loss" else math.inf
            h["attention"] = {k: math.nan for k in h["attention"]}
    src = tmp_path / "heads.json"
    src.write_text(json.dumps(doc))  # bare NaN / Infinity tokens, as older files hold
    res = invoke("report", src, "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    assert "No head has a finite causal effect" in (tmp_path / "r.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(80, 64), (200, 200)])
def test_heads_of_a_70b_class_model_are_drawn_as_images_with_every_layer_listed(tmp_path, shape):
    doc = rf.make_heads(*shape, n_kept=0, vital=[(3, 4)], inert=[])
    doc["examples"] = []
    src = tmp_path / "heads.json"
    src.write_text(json.dumps(doc))
    res = invoke("report", src, "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    assert not [line for line in res.stderr.splitlines() if line.startswith("note: ")], res.stderr
    html = (tmp_path / "r.html").read_text()
    assert html.count('<img class="plot') == 3
    assert html.count('<details class="layer"') == shape[0]
    last = f"<tr><td>{head_label(shape[0] - 1, shape[1] - 1)}</td>"
    assert html.count("<tr><td>L3.H") >= shape[1] and html.count(last) == 1 and "· largest Δ loss" in html
    assert len(html) < 15e6


@pytest.mark.slow
def test_numbers_near_float_max_are_drawn_as_infinite_not_a_crash(tmp_path):
    """1e308 is valid JSON and a finite float, but matplotlib cannot lay out an axis around it."""
    run = run_folder(tmp_path, edit_record(4, loss=1e308, lr=-1e308))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[5])
    for stats in rec["attention"].values():
        stats["entropy"] = [1e308] * len(stats["entropy"])
    lines[5] = json.dumps(rec)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    doc = rf.make_heads(n_kept=1)
    for h in doc["heads"]:
        h["delta_loss"], h["attention"]["max_weight"] = 1e308, -1e308
    src = tmp_path / "heads.json"
    src.write_text(json.dumps(doc))
    res = invoke("report", src, run, "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output


def test_lone_surrogate_and_long_csv_cell(files, hf_folder):
    path = files / "s.jsonl"
    path.write_text('{"text": "the \\ud800 cat", "label": 0}\n')
    assert_refused(invoke("info", hf_folder, "--data", path), path, "line 1", "surrogate")
    csv_path = files / "long.csv"  # one 320 KB cell: over csv's default 128 KiB field limit, still valid
    csv_path.write_text("text,label\n\"" + "the cat " * 40_000 + "\",1\na dog,0\n")
    res = invoke("info", hf_folder, "--data", csv_path)
    assert res.exit_code == 0, res.output
    assert "N=2" in res.output


def test_hf_config_claiming_more_layers_than_the_weights_hold(tmp_path, monkeypatch):
    """100,000 claimed layers took minutes to build before transformers found them missing: the
    config is refused before any model is built."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=2, n_head=2, n_positions=8)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] = 100_000
    (folder / "config.json").write_text(json.dumps(config))
    def built(self, *args, **kwargs):
        raise AssertionError("the model was built before its config was checked against its weights")

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", built)
    assert_refused(invoke("info", folder), folder / "config.json", "num_hidden_layers=100000", "2 layers")


def test_follow_refuses_a_fifo_metrics_file(tmp_path):
    """`stats --follow` reads the log again and again: a FIFO there would block it at once."""
    run = run_folder(tmp_path, special_in_run("metrics.jsonl", "fifo"))
    assert_refused(invoke("stats", run, "--follow"), "metrics.jsonl", "named pipe")
