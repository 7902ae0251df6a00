"""Hostile inputs on the newest surfaces (issue 36), table-driven: settings checked when they are made
(Thresholds, --seed, --draws, --methods, --max-memory), the shipped demo manifest read as input, run-folder
readers that hand on only bounded steps (stats, --tensorboard, --follow), report sources built in Python.
Each refusal is exit 2 (or the library's DiagnoseError) and one line naming the input and the fix; no
traceback; the input is left as it was."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from diagnose.errors import ConfigError, DiagnoseError, UsageError
from diagnose.monitor import Thresholds

from .hostile import assert_refused, edit_info, edit_record, invoke, rf, run_folder, tree

pytestmark = pytest.mark.numerics

THRESHOLDS = [("extra a string", dict(extra={"z_rms_max": "20"}), "z_rms_max"),
              ("extra a word", dict(extra={"z_patience": "abc"}), "z_patience"),
              ("extra a list", dict(extra=[("z_patience", 3)]), "a dict"),
              ("extra NaN", dict(extra={"z_rms_max": float("nan")}), "finite"),
              ("extra true", dict(extra={"z_rms_max": True}), "a number"),
              ("a ratio a string", dict(grad_spike_ratio="4"), "grad_spike_ratio"),
              ("a window of 0", dict(window=0), "window"),
              ("a patience of 2.5", dict(rank_patience=2.5), "whole number"),
              ("a negative cooldown", dict(cooldown=-1), "0 or more")]


@pytest.mark.parametrize("what, kw, words", THRESHOLDS, ids=[c[0] for c in THRESHOLDS])
def test_thresholds_are_checked_when_made(what, kw, words):
    with pytest.raises(ConfigError, match=words) as caught:
        Thresholds(**kw)
    assert "\n" not in str(caught.value)


def test_thresholds_that_are_fine_stay_as_they_were():
    t = Thresholds(extra={"z_rms_max": 20, "z_patience": 3}, warmup_check=False, init_entropy_frac=0)
    assert t.extra == {"z_rms_max": 20, "z_patience": 3} and t.warmup_check is False
    import numpy as np

    assert Thresholds(window=np.int64(7), grad_spike_ratio=np.float32(4.0)).window == 7  # numpy's numbers count


def test_numpy_integers_are_whole_numbers_for_draws_and_seed():
    import numpy as np

    from diagnose.ablation import AblationConfig

    config = AblationConfig(method="resample", draws=np.int64(3), seed=np.int64(5))
    assert (config.draws, config.seed) == (3, 5) and type(config.seed) is int  # written as JSON integers


HEADS = [("a negative seed", ["--seed", "-1"], "--seed"),
         ("a seed over 2**63", ["--seed", str(2 ** 64)], "--seed"),
         ("no draws", ["--method", "resample", "--draws", "0"], "draws"),
         ("a billion draws", ["--method", "resample", "--draws", str(10 ** 9)], "1000"),
         ("10**23 draws", ["--method", "resample", "--draws", str(10 ** 23)], "1000"),
         ("draws no compared method uses", ["--methods", "zero,mean", "--draws", "3"], "--draws"),
         ("draws a zero ablation ignores", ["--method", "zero", "--draws", "3"], "draws")]


@pytest.mark.parametrize("what, args, words", HEADS, ids=[c[0] for c in HEADS])
def test_heads_numbers_are_refused_before_the_model_loads(tmp_path, what, args, words):
    # the model file does not even exist: the numbers are judged first
    assert_refused(invoke("heads", tmp_path / "model.pt", "--data", tmp_path / "eval.pt", *args), words)


def test_a_tiny_max_memory_says_sizes_a_person_reads(files):
    line = assert_refused(invoke("heads", "model.pt", "--data", "eval.pt", "--max-memory", "1KB"), "1 KB")
    assert "0 MB" not in line and "raise it" in line


def _tiny():
    from diagnose.zoo import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=8))
    return model, {"input_ids": torch.randint(1, 12, (6, 5), generator=torch.Generator().manual_seed(0))}


METHODS = [("a string of names", dict(methods="zero,mean"), UsageError, "split"),
           ("a list of numbers", dict(methods=[0, 1]), UsageError, "names"),
           ("draws 2.5", dict(methods=["zero", "resample"], draws=2.5), ConfigError, "whole number"),
           ("draws True", dict(methods=["zero", "resample"], draws=True), ConfigError, "whole number"),
           ("draws '3'", dict(methods=["zero", "resample"], draws="3"), ConfigError, "whole number"),
           ("draws for zero and mean", dict(methods=["zero", "mean"], draws=3), ConfigError, "ignored"),
           ("a seed of -1", dict(methods=["zero", "mean"], seed=-1), ConfigError, "seed")]


@pytest.mark.parametrize("what, kw, error, words", METHODS, ids=[c[0] for c in METHODS])
def test_ablate_methods_refuses_before_any_sweep(what, kw, error, words):
    from diagnose.ablation import ablate_methods

    model, data = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kw = dict(kw)
    with pytest.raises(error, match=words):
        ablate_methods(model, data, kw.pop("methods"), task="lm", progress=False, **kw)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- the shipped demo manifest ------------------------------------------------------------------

def _manifest(models: Path, edit) -> Path:
    path = models / "manifest.json"
    data = json.loads(path.read_text())
    edit(data["models"]["induction"], data)
    path.write_text(json.dumps(data))
    return path


def _set(**changes):
    return lambda entry, data: entry.update(changes)


MANIFEST = [("entry a string", lambda e, d: d["models"].update(induction="x"), "`files`"),
            ("entry a list", lambda e, d: d["models"].update(induction=[1, 2]), "`files`"),
            ("files a string", _set(files="induction.safetensors"), "`files`"),
            ("files a list", _set(files=["induction.safetensors"]), "`files`"),
            ("weights outside the folder", _set(weights="../../_shipped.py"), "not a path inside"),
            ("weights an absolute path", _set(weights="/etc/passwd"), "not a path inside"),
            ("weights a number", _set(weights=3), "weights"),
            ("weights not hashed", lambda e, d: e["files"].pop("induction.safetensors"), "no sha256"),
            ("run outside the folder", _set(run="../../demo"), "run"),
            ("a file outside the folder", lambda e, d: e["files"].update({"../../_run.py": "0" * 64}), "file")]


@pytest.fixture
def models(tmp_path):
    from diagnose.demo import _shipped

    shutil.copytree(_shipped.MODELS_DIR, tmp_path / "models")
    return tmp_path / "models"


def _variant():
    from diagnose.demo import demo_variants

    return next(v for v in demo_variants() if v.name == "induction")


@pytest.mark.parametrize("what, edit, words", MANIFEST, ids=[c[0] for c in MANIFEST])
def test_a_tampered_manifest_is_one_line_naming_it(models, what, edit, words):
    from diagnose.demo import _shipped

    path = _manifest(models, edit)
    before = tree(models)
    with pytest.raises(DiagnoseError, match=words) as caught:
        _shipped.load(_variant(), None, models)  # refused before the eval data is looked at
    line = str(caught.value)
    assert "\n" not in line and str(path) in line and "reinstall diagnose" in line
    assert tree(models) == before


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge"])
def test_a_manifest_that_is_no_regular_small_file_is_refused(models, kind):
    from diagnose.demo import _shipped

    path = models / "manifest.json"
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(" " * (_shipped.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(DiagnoseError, match="manifest.json") as caught:
        _shipped.manifest(models)  # returns at once: a FIFO is not opened, /dev/zero not read
    assert "\n" not in str(caught.value)


def test_make_models_onto_a_file_is_one_line(tmp_path, capsys):
    from diagnose.demo import make_models

    (tmp_path / "out").write_text("mine")
    with pytest.raises(SystemExit) as caught:
        make_models.main(["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and "out" in err[0]
    assert (tmp_path / "out").read_text() == "mine"


# ---- run-folder readers -------------------------------------------------------------------------

def _alert_step(value: str):
    def edit(run: Path):
        a = rf.alert(3)
        (run / "alerts.jsonl").write_text(json.dumps(a).replace('"step": 3', f'"step": {value}') + "\n")
    return edit


READERS = [("an alert step of NaN", _alert_step("NaN"), "alerts.jsonl"),
           ("an alert step of 1e30", _alert_step("1e30"), "alerts.jsonl"),
           ("an alert step of 2.5", _alert_step("2.5"), "alerts.jsonl"),
           ("a record step of 2**70", edit_record(3, step=2 ** 70), "metrics.jsonl"),
           ("a negative record step", edit_record(3, step=-5), "metrics.jsonl"),
           ("run.json clip a word", edit_info(clip="abc"), "`clip`"),
           ("settings.clip a list", edit_info(settings={"clip": [1]}), "`settings.clip`"),
           ("settings.every an object", edit_info(settings={"every": {}}), "`settings.every`")]


@pytest.mark.parametrize("what, edit, words", READERS, ids=[c[0] for c in READERS])
def test_run_folder_numbers_are_bounded_at_the_reader(tmp_path, what, edit, words):
    pytest.importorskip("tensorboard")
    run = run_folder(tmp_path, edit)
    before = tree(run)
    for args in (["stats", run], ["stats", run, "--tensorboard", tmp_path / "tb"], ["stats", run, "--follow"]):
        assert_refused(invoke(*args), words)
    assert tree(run) == before and not (tmp_path / "tb").exists()


def test_an_eval_step_of_2_70_is_skipped_and_the_export_goes_on(tmp_path):
    pytest.importorskip("tensorboard")

    def edit(run: Path):
        (run / "evals.jsonl").write_text(json.dumps({"step": 2 ** 70, "loss": 1.0, "metrics": {}}) + "\n")
    run = run_folder(tmp_path, edit)
    res = invoke("stats", run, "--tensorboard", tmp_path / "tb")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "skipped" in invoke("stats", run).output


def test_follow_skips_a_deeply_nested_last_line_as_stats_does(tmp_path):
    def edit(run: Path):
        with open(run / "metrics.jsonl", "a") as f:
            f.write("[" * 200_000 + "]" * 200_000 + "\n")
    run = run_folder(tmp_path, edit)
    for args in (["stats", run], ["stats", run, "--follow"]):
        res = invoke(*args)
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
        assert "steps 0..19 (20 logged)" in res.output and "1 torn line(s) skipped" in res.output


# ---- report sources built in Python -------------------------------------------------------------

def _heads(**changes):
    doc = copy.deepcopy(rf.make_heads())
    doc.update(changes)
    return doc


def test_report_dict_sources_are_checked_like_files():
    from diagnose.reports._sources import load_sources

    huge = _heads()
    huge["heads"][0]["direct_delta_loss"] = 10 ** 400
    with pytest.raises(DiagnoseError, match=r"source 1 \(dict\): heads\[0\]\.direct_delta_loss") as caught:
        load_sources([huge])
    assert "\n" not in str(caught.value)


def test_method_agreement_with_lists_of_lists_and_thousands_of_rows_stays_bounded():
    from diagnose.reports.view_heads import MAX_LISTED, _depends

    rows = [{"layer": 0, "head": h, "agree": False, "verdicts": {"zero": "matters", "mean": "negligible"}}
            for h in range(3_000)]
    agreement = {"methods": ["zero", "mean"], "heads": rows, "contradicts": [[[0], [1]], [0, 1], "x", [0, 2]]}
    said = _depends(agreement, True)
    assert said[:2] == ["L0.H1 (zero: matters, mean: negligible)", "L0.H2 (zero: matters, mean: negligible)"]
    assert len(said) == 2  # the pair of lists and the string are no pairs of heads
    many = _depends({**agreement, "contradicts": None}, True)  # a document without `contradicts`: all of them
    assert len(many) == MAX_LISTED + 1 and many[-1].startswith(f"{3_000 - MAX_LISTED} more heads")


def test_a_400_digit_number_is_shown_as_inf():
    from diagnose.reports._render import _format_number

    assert _format_number(10 ** 400) == "inf" and _format_number(-(10 ** 400)) == "-inf"


@pytest.mark.slow  # one start of the installed binary: ~15 s on a busy 2-core box
def test_the_binary_refuses_hostile_settings_with_one_line(tmp_path):
    """The installed `diagnose` (not in-process): a bad --seed is one line and exit 2, before any import of torch's
    model code would matter."""
    import subprocess

    exe = Path(sys.executable).with_name("diagnose")
    proc = subprocess.run([str(exe), "heads", str(tmp_path / "m.pt"), "--data", str(tmp_path / "d.pt"),
                           "--seed", "-3"], capture_output=True, text=True, timeout=120)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--seed" in lines[0] and "Traceback" not in proc.stderr


def test_a_usage_error_is_printed_by_rank_0_only(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ("heads", "m.pt", "--data", "d.pt", "--draws", "abc")
    monkeypatch.setenv("RANK", "1")
    res = invoke(*args)
    assert res.exit_code == 2 and res.output == ""
    monkeypatch.setenv("RANK", "0")
    res = invoke(*args)
    assert res.exit_code == 2 and res.output.count("Error: Invalid value for '--draws'") == 1


@pytest.mark.parametrize("step", [2 ** 70, -1, "x"])
def test_steps_the_readers_would_refuse_are_refused_when_written(tmp_path, step):
    from diagnose.monitor import TrainingMonitor
    from diagnose.zoo import ModelConfig, Transformer

    with TrainingMonitor(Transformer(ModelConfig(n_layers=1, n_heads=2, d_model=8, max_len=8, vocab_size=11)),
                         tmp_path / "run", echo=False) as monitor:
        with pytest.raises((ConfigError, UsageError), match="step"):
            monitor.log_eval(step, loss=1.0)
        with pytest.raises(ConfigError, match="step="):
            monitor.step(1.0, step=step)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""
