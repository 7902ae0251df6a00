"""Hostile records on the newer surfaces (issue 25): spike records and batches, evaluations, prune
JSON in the report, integers no float holds, --max-memory, metric names from a trainer, torchrun.

Bad input: exit code 2 and one `error:` line naming the file and field (or option) and the fix, no
traceback. A damaged side file of a run (a spike record, an evaluation) is skipped and counted by
`stats` and `report`, as torn lines are; `stats --step N` on that step names what is wrong.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diagnose.cli.main import cli  # noqa: F401  (the CLI under test, through invoke)

from .hostile import tree
from .hostile import assert_refused, invoke
from .test_stats_extras import _train

pytestmark = pytest.mark.numerics

HUGE = "9" * 400  # JSON allows it; a float does not hold it


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder with evaluations and a spike batch saved at step 4 (4 examples)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    _train(run)
    return run


@pytest.fixture
def run(tmp_path, trained):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def _edit_spike(run: Path, **changes) -> Path:
    path = run / "spikes" / "step_00000004.json"
    rec = json.loads(path.read_text())
    rec.update(changes)
    path.write_text(json.dumps(rec))
    return path


def _save_batch(run: Path, **tensors) -> Path:
    from safetensors.torch import save_file

    path = run / "spikes" / "step_00000004.safetensors"
    save_file(tensors, str(path))
    return path


SPIKE_RECORDS = [("kinds an integer", {"kinds": 3}, "`kinds`"), ("tensors a string", {"tensors": "x"}, "`tensors`"),
                 ("a shape of strings", {"tensors": {"input_ids": {"shape": ["a"], "dtype": "int64"}}}, "`tensors`"),
                 ("bytes huge", {"bytes": "HUGE"}, "`bytes`"), ("note a list", {"note": [1]}, "`note`"),
                 ("truncated a string", {"truncated": "no"}, "`truncated`")]


@pytest.mark.parametrize("what, change, words", SPIKE_RECORDS, ids=[c[0] for c in SPIKE_RECORDS])
def test_damaged_spike_record(run, tmp_path, what, change, words):
    path = _edit_spike(run, **change)
    if "HUGE" in json.dumps(change):
        path.write_text(path.read_text().replace('"HUGE"', HUGE))
        words = "`bytes` is an integer of 400 digits"
    before = tree(run)
    assert_refused(invoke("stats", run, "--step", 4), path, words, fix="delete it")
    for args in (["stats", run], ["report", run, "-o", tmp_path / "r.html"]):  # a side file: skipped, counted
        res = invoke(*args)
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "skipped" in invoke("stats", run).output
    assert tree(run) == before


def test_spike_batch_with_a_complex_loss(run):
    path = _save_batch(run, input_ids=torch.ones(4, 8, dtype=torch.long),
                       per_example_loss=torch.ones(4, dtype=torch.complex64))
    assert_refused(invoke("stats", run, "--step", 4), path, "per_example_loss", "complex64", fix="delete it")


def test_spike_batch_with_one_dimensional_ids_shows_the_losses(run):
    _save_batch(run, input_ids=torch.arange(4), per_example_loss=torch.tensor([1.0, 3.0, 2.0, 3.0]))
    res = invoke("stats", run, "--step", 4, "--json")
    assert res.exit_code == 0, res.output
    examples = json.loads(res.stdout)["examples"]
    assert [e["index"] for e in examples] == [1, 3, 2, 0] and not any("input_ids" in e for e in examples)


def test_spike_batch_behind_dev_zero_is_a_device_not_missing(run):
    path = run / "spikes" / "step_00000004.safetensors"
    path.unlink()
    path.symlink_to("/dev/zero")
    line = assert_refused(invoke("stats", run, "--step", 4), path, "character device")
    assert "does not exist" not in line


def test_spike_batch_over_the_cap_is_refused_without_reading_it(run, monkeypatch):
    monkeypatch.setattr("diagnose.monitor._spikes.MAX_SPIKE_FILE", 1000)
    path = _save_batch(run, per_example_loss=torch.zeros(1000))
    assert_refused(invoke("stats", run, "--step", 4), path, "over the 1,000", fix="spike_bytes")


def test_many_per_example_losses_are_ranked_on_the_tensor(run, monkeypatch):
    """4 M losses: sorted element by element in Python this took minutes; on the tensor, seconds.
    Held without a clock: no tensor of more than a few thousand elements becomes a Python list or
    is iterated in Python. Integer-valued losses, so the expected order needs no float tolerance:
    NaN last, ties by index."""
    n = 1 << 22
    loss = torch.zeros(n)
    loss[[5, 77, 4000, n - 1]] = torch.tensor([7.0, 9.0, 7.0, 8.0])
    loss[10] = float("nan")
    ids = torch.arange(n * 2, dtype=torch.int32).reshape(n, 2) % 100  # [N, T]
    _save_batch(run, input_ids=ids, per_example_loss=loss)

    def in_python(real):
        def guarded(self, *args, **kwargs):
            assert self.numel() <= 4096, f"a tensor of {self.numel():,} elements went through Python"
            return real(self, *args, **kwargs)
        return guarded

    monkeypatch.setattr(torch.Tensor, "tolist", in_python(torch.Tensor.tolist))
    monkeypatch.setattr(torch.Tensor, "__iter__", in_python(torch.Tensor.__iter__))
    res = invoke("stats", run, "--step", 4, "--json")
    assert res.exit_code == 0, res.output
    examples = json.loads(res.stdout)["examples"]
    assert [e["index"] for e in examples] == [77, n - 1, 5, 4000, 0]
    assert examples[0]["loss"] == 9.0 and examples[0]["input_ids"] == [54, 55]


# --- integers no float holds --------------------------------------------------------------------


def test_huge_integer_in_evals_is_skipped_by_stats(run):
    with open(run / "evals.jsonl", "a") as f:
        f.write('{"step": 9, "time": 1.0, "loss": ' + HUGE + ', "metrics": {}}\n')
    res = invoke("stats", run)
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "1 torn line(s) skipped" in res.output


def test_huge_integer_in_metrics_names_the_line_and_field(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["loss"] = "HUGE"
    lines[2] = json.dumps(rec).replace('"HUGE"', HUGE)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert_refused(invoke("stats", run), "metrics.jsonl, line 3", "`loss` is an integer of 400 digits",
                   fix="restore it")


@pytest.mark.parametrize("value, words", [(HUGE, "more memory than any machine"), (HUGE + "GB", "more memory"),
                                          ("1e999", "not a size"), ("0", "positive")])
def test_max_memory_of_400_digits(tmp_path, monkeypatch, value, words):
    monkeypatch.chdir(tmp_path)
    assert_refused(invoke("heads", "m.pt", "--data", "d.pt", "--max-memory", value), "--max-memory", words)


# --- the prune section of the report ------------------------------------------------------------


def _prune_doc() -> dict:
    point = {"n_removed": 0, "fraction_removed": 0.0, "accuracy": 0.75, "loss": 1.0}
    return {"schema": "diagnose.prune/1", "model": {"family": "reference", "n_heads": [2, 2]}, "task": "classification",
            "budget": {"max_drop": 1.0, "max_loss": None}, "n_removed": 1, "fraction_removed": 0.25,
            "curve": [point, {**point, "n_removed": 1, "fraction_removed": 0.25, "layer": 0, "head": 1}],
            "order": [{"layer": 0, "head": 1, "accuracy": 0.75, "loss": 1.0}], "heads_left": [1, 2],
            "stop": {"reason": "budget", "next": {"accuracy": 0.5, "loss": 2.0}},
            "verify": {"max_abs_diff": 0.0}, "data": {"before": {"accuracy": 0.75, "loss": 1.0},
                                                       "after": {"accuracy": 0.75, "loss": 1.0}, "noise": 0.1},
            "eval": None, "size": {"parameters_before": 100, "parameters_after": 90}, "notes": []}


PRUNE_BAD = [
    ("curve accuracy {}", lambda d: d["curve"][1].update(accuracy={}), "`curve[1].accuracy` is an object"),
    ("curve loss a string", lambda d: d["curve"][0].update(loss="1.0"), "`curve[0].loss` is a string"),
    ("budget a huge integer", lambda d: d["budget"].update(max_drop="HUGE"), "`budget.max_drop` is an integer"),
    ("curve a huge integer", lambda d: d["curve"][0].update(fraction_removed="HUGE"), "curve[0].fraction_removed"),
    ("order an object", lambda d: d.update(order={}), "`order` is an object"),
    ("order accuracy a list", lambda d: d["order"][0].update(accuracy=[1]), "`order[0].accuracy` is a list"),
    ("size a list", lambda d: d.update(size=[1]), "`size` is a list"),
    ("parameters a string", lambda d: d["size"].update(parameters_after="90"), "`size.parameters_after`"),
    ("eval a string", lambda d: d.update(eval="x"), "`eval` is a string"),
    ("stop.next a list", lambda d: d["stop"].update(next=[1]), "`stop.next` is a list"),
    ("notes a number", lambda d: d.update(notes=5), "`notes` is an integer"),
    ("heads_left a bool", lambda d: d.update(heads_left=[True, 2]), "`heads_left[0]` is a bool"),
    ("heads_left over n_heads", lambda d: d.update(heads_left=[3, 2]), "`heads_left`"),
    ("curve empty", lambda d: d.update(curve=[]), "`curve` is empty"),
]
PRUNE_FINE = [
    ("nulls where diagnose writes NaN", lambda d: (d["curve"][1].update(accuracy=None, loss=None),
                                                   d["order"][0].update(accuracy=None), d.update(notes=None),
                                                   d["verify"].update(max_abs_diff=None))),
    ("numbers near float max", lambda d: (d["budget"].update(max_drop=1e308), d["curve"][1].update(loss=1e308))),
    ("objects left out", lambda d: [d.pop(k) for k in ("budget", "stop", "verify", "data", "size")]),
]


@pytest.mark.parametrize("what, edit, words", PRUNE_BAD, ids=[c[0] for c in PRUNE_BAD])
def test_broken_prune_json_one_line_nothing_written(tmp_path, what, edit, words):
    doc = _prune_doc()
    edit(doc)
    src = tmp_path / "prune.json"
    src.write_text(json.dumps(doc).replace('"HUGE"', HUGE))
    assert_refused(invoke("report", src, "-o", tmp_path / "r.html"), src, words, fix="diagnose prune --json")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("what, edit", PRUNE_FINE, ids=[c[0] for c in PRUNE_FINE])
def test_prune_json_with_gaps_still_renders(tmp_path, what, edit):
    doc = _prune_doc()
    edit(doc)
    src = tmp_path / "prune.json"
    src.write_text(json.dumps(doc))
    res = invoke("report", src, "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    assert 'id="prune"' in (tmp_path / "r.html").read_text()


# --- trainers and torchrun ----------------------------------------------------------------------


def test_hf_callback_logs_any_metric_name_and_never_raises(tmp_path):
    from types import SimpleNamespace

    from diagnose.monitor import TrainingMonitor, read_run
    from diagnose.monitor.hf import DiagnoseHFCallback

    cb = DiagnoseHFCallback(tmp_path / "run")
    cb.monitor = TrainingMonitor(torch.nn.Linear(2, 2), tmp_path / "run", every=1, echo=False)
    metrics = {"eval_loss": 0.5, "eval_step": 3.0, "eval_self": 2.0, "eval_loss_x": "high", "eval_big": 10**400,
               "eval_c": complex(1, 2), "epoch": 1.0}
    cb.on_evaluate(None, SimpleNamespace(global_step=7), None, metrics=metrics)  # inside trainer.evaluate()
    cb.monitor.log_eval(8, loss=1.0, step=4, self=5)  # the same names through the public call
    cb.monitor.close()
    evals = read_run(tmp_path / "run", allow_empty=True).evals
    assert list(evals["step"]) == [7, 8] and list(evals["loss"]) == [0.5, 1.0]


def test_python_m_diagnose_inside_a_model_folder_runs_none_of_its_files(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    marker = tmp_path / "RAN"
    for name in ("rich.py", "click.py", "numpy.py"):
        (folder / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text({name!r})\n")
    proc = subprocess.run([sys.executable, "-m", "diagnose", "info", "."], cwd=folder, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("error: ") == 1, proc.stderr
    assert not marker.exists(), f"{marker.read_text()} from the model folder ran"


def test_docs_give_the_torchrun_form_that_keeps_the_folder_off_the_path():
    root = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/heads.md", "cli/heads.py"):
        text = (root / page).read_text()
        assert "--no-python diagnose heads" in text and "-m diagnose heads" not in text, page


def test_rank_one_leaves_quietly_when_rank_zero_left_first(monkeypatch):
    """What a gloo collective raises on rank 1 once rank 0 has exited with its one line."""
    def broken(*_a, **_k):
        raise torch.distributed.DistNetworkError("Connection closed by peer [127.0.0.1]:29500")
    monkeypatch.setattr("diagnose.io.load_model", broken)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    res = invoke("info", "m.pt")
    assert res.exit_code == 2 and res.output == "", res.output  # rank 0 printed the one line
    monkeypatch.setenv("RANK", "0")  # rank 1 died outright (killed, out of memory): rank 0 says so, once
    assert_refused(invoke("info", "m.pt"), "another torchrun process exited", "Connection closed by peer")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None, reason="no torchrun")
def test_documented_torchrun_form_inside_a_model_folder(tmp_path):
    """`torchrun --no-python diagnose heads .` in a folder with its own rich.py: the file never runs,
    and the bad labels are one error line from rank 0 (rank 1 prints nothing)."""
    from transformers import BertConfig, BertForSequenceClassification

    from ..wordlevel import WORDS, make_tokenizer

    folder = tmp_path / "bert"
    cfg = BertConfig(vocab_size=len(WORDS) + 4, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16, num_labels=2)
    BertForSequenceClassification(cfg).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    marker = tmp_path / "RAN"
    (folder / "rich.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    (tmp_path / "d.jsonl").write_text('{"text": "the cat", "label": 0}\n{"text": "a dog", "label": 7}\n')
    before = tree(folder)
    bin_dir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bin_dir, "torchrun"), "--standalone", "--nproc-per-node", "2", "--no-python",
                           os.path.join(bin_dir, "diagnose"), "heads", ".", "--data", "../d.jsonl"], cwd=folder,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and "d.jsonl" in errors[0] and "labels" in errors[0], proc.stderr
    assert proc.stderr.split(errors[0])[0].count("Traceback") == 0  # nothing from a worker before the line
    assert not marker.exists() and tree(folder) == before
