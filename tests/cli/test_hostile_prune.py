"""Hostile inputs on prune (issue 25): --out guarded like every output, --eval trial-run, a budget
that does not fit the task, and a pruned folder's config checked before anything is built.

Every case: exit code 2, one `error:` line naming the file or option and the fix, no traceback,
the inputs byte for byte as they were, nothing written inside an input folder, no code from a
model folder run, and refused before any pruning round (prune_heads is never called).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import diagnose
from diagnose.zoo import ModelConfig, Transformer

from .hostile import tree
from .hostile import assert_refused, invoke

pytestmark = pytest.mark.numerics


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A tiny classifier and LM checkpoint, their data, and held-out data with one bad id, in the cwd."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    clf = Transformer(ModelConfig(kind="classifier", vocab_size=12, n_classes=3, max_len=8, n_layers=1, n_heads=2,
                                  d_model=16))
    diagnose.save_checkpoint(clf, tmp_path / "clf.pt")
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=16))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    ids = torch.randint(1, 12, (10, 6), generator=torch.Generator().manual_seed(1))  # [N, T]
    torch.save({"input_ids": ids, "labels": torch.arange(10) % 3}, tmp_path / "eval.pt")
    torch.save({"input_ids": ids}, tmp_path / "lm-data.pt")
    bad = ids.clone()
    bad[7, 2] = 50  # beyond the 12-token vocabulary, only in the held-out file, in its 8th example
    torch.save({"input_ids": bad, "labels": torch.arange(10) % 3}, tmp_path / "held.pt")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("keep")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "empty")
    return tmp_path


PRUNE = ("prune", "clf.pt", "--data", "eval.pt", "--max-drop", "100")
# (what, extra arguments, words the one line holds)
REFUSED = [
    ("--out onto the model file", ["--out", "clf.pt"], ["--out", "input"]),
    ("--out inside the model's folder", ["--out", "{model_dir}/pruned"], ["--out", "inside the input folder"]),
    ("--out a dangling symlink", ["--out", "dangling"], ["--out", "symbolic link to nothing"]),
    ("--out a symlink to an empty folder", ["--out", "linked"], ["--out", "symbolic link", "real folder"]),
    ("--out a folder with files", ["--out", "full"], ["full", "not empty", "new or empty folder"]),
    ("--out a file", ["--out", "eval.pt"], ["--out", "input"]),
    ("--out under a file", ["--out", "clf.pt/pruned"], ["not a folder"]),
    ("--out and --json the same path", ["--out", "o", "--json", "o"], ["same file"]),
    ("--eval id out of range in one example", ["--eval", "held.pt"], ["held.pt", "vocabulary", "tokenise"]),
    ("--max-drop on a language model", ["--max-drop", "5"], ["--max-drop", "language model", "--max-loss"]),
]


@pytest.fixture
def no_round(monkeypatch):
    """prune_heads fails the test if called: a refusal must come before any pruning round."""
    def refused(*args, **kwargs):
        raise AssertionError("a pruning round started before the input was refused")

    monkeypatch.setattr("diagnose.prune.prune_heads", refused)


@pytest.mark.parametrize("what, extra, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_prune_refuses_before_any_round(files, no_round, what, extra, words):
    base = ("prune", "lm.pt", "--data", "lm-data.pt") if "language" in what else PRUNE
    if "{model_dir}" in " ".join(extra):  # the input is a folder: a pruned copy must not land inside it
        shutil.copytree(files, files.parent / "model_dir", ignore=shutil.ignore_patterns("dangling", "linked"))
        base = ("prune", files.parent / "model_dir", "--data", "eval.pt", "--factory", "x:y")
    extra = [str(a).replace("{model_dir}", str(files.parent / "model_dir")) for a in extra]
    before = tree(files)
    assert_refused(invoke(*base, *extra), *words)
    assert tree(files) == before, "an input changed, or a file was written among them"
    assert not (files / "empty").exists() or not any((files / "empty").iterdir())
    assert not [p for p in files.iterdir() if p.name.startswith(".")], "a work folder was left behind"


def test_out_in_a_folder_that_cannot_be_written_is_refused_first(files, no_round, monkeypatch):
    """chmod 555 stops no one running as root: os.access's answer for that folder is simulated."""
    (files / "locked").mkdir()
    real = os.access
    monkeypatch.setattr("diagnose._write.os.access",
                        lambda p, mode: False if Path(p) == files / "locked" else real(p, mode))
    assert_refused(invoke(*PRUNE, "--out", files / "locked" / "pruned"), "locked", "read-only",
                   fix="choose a folder you can write to")
    assert list((files / "locked").iterdir()) == []


def test_failed_save_keeps_the_pruned_model_and_writes_the_json(files, monkeypatch):
    """The disk refuses the folder only at the end: the model is kept in $TMPDIR, named in the one line."""
    import tempfile

    (files / "out").mkdir()
    real = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        if kw.get("dir") is not None and Path(kw["dir"]) == files / "out":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*a, **kw)
    monkeypatch.setattr("diagnose.prune.save.tempfile.mkdtemp", mkdtemp)
    res = invoke(*PRUNE, "--out", files / "out" / "pruned", "--json", "p.json")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    errors = [x for x in res.stderr.splitlines() if x.startswith("error: ")]  # after the rounds' progress lines
    assert len(errors) == 1 and res.stderr.strip().splitlines()[-1] == errors[0], res.stderr
    line = errors[0]
    for word in (str(files / "out" / "pruned"), "Read-only file system", "saved to"):
        assert word in line, line
    spare = Path(re.search(r"saved to (\S+) instead", line).group(1))
    try:
        assert list((files / "out").iterdir()) == []
        again = diagnose.load_model(spare / "model.pt")  # the whole pruned model, loadable
        assert json.loads((files / "p.json").read_text())["schema"] == "diagnose.prune/1"
        assert again.cfg.layer_heads is not None
    finally:
        shutil.rmtree(spare)


# --- a pruned folder's config ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pruned_folder(tmp_path_factory):
    """A pruned tiny BERT classifier folder (2 layers of 2 heads, one head removed per layer)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(cfg).eval()
    ids = torch.randint(1, 20, (8, 6), generator=torch.Generator().manual_seed(0))
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.arange(8) % 2}
    folder = tmp_path_factory.mktemp("pruned") / "pruned"
    diagnose.prune_heads(model, data, max_drop=100.0, candidates=1).save_pretrained(folder)
    return folder


SELF = "bert.encoder.layer.0.attention.self"
DENSE = "bert.encoder.layer.0.attention.output.dense"


def _attrs(owner, **kw):
    return lambda c: c["diagnose_pruned"]["attributes"].setdefault(owner, {}).update(kw)


CONFIG_CASES = [
    ("a method named", _attrs(SELF, forward=3), ["forward", "only all_head_size"]),
    ("no heads", _attrs(SELF, num_attention_heads=0), ["num_attention_heads is 0", "head count"]),
    ("10**9 heads", _attrs(SELF, num_attention_heads=10**9), ["num_attention_heads is 1000000000"]),
    ("a float width", _attrs(SELF, all_head_size=4.0), ["all_head_size", "not an integer"]),
    ("a bool", _attrs(SELF, num_attention_heads=True), ["num_attention_heads", "a bool"]),
    ("a module not there", _attrs("bert.nope", nf=2), ["'bert.nope'", "no weights"]),
    ("in_features against its weight", _attrs(DENSE, in_features=7), ["in_features is 7", "shape"]),
    ("a shape the weights lack", lambda c: c["diagnose_pruned"]["shapes"].update(
        {f"{SELF}.key.weight": [400, 8]}), ["key.weight", "[400, 8]"]),
    ("a shape on a method", lambda c: c["diagnose_pruned"]["shapes"].update({f"{SELF}.forward": [1]}),
     ["forward", "weights and biases"]),
    ("heads_left of 10**9", lambda c: c["diagnose_pruned"].update(heads_left=[1, 10**9]), ["heads_left"]),
    ("diagnose_pruned a list", lambda c: c.update(diagnose_pruned=[1]), ["diagnose_pruned must be an object"]),
    ("a key too many", lambda c: c["diagnose_pruned"].update(code="x"), ["diagnose_pruned must be an object"]),
]


@pytest.mark.parametrize("what, edit, words", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_pruned_folder_config_checked_before_building(tmp_path, pruned_folder, what, edit, words):
    folder = tmp_path / "p"
    shutil.copytree(pruned_folder, folder)
    marker = tmp_path / "RAN"
    (folder / "pruned_heads.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    before = tree(folder)
    assert_refused(invoke("info", folder), folder / "config.json", *words, fix="prune the original model again")
    assert not marker.exists() and tree(folder) == before


@pytest.mark.parametrize("architectures, words", [
    (["pipeline"], ["architectures", "'pipeline'", "BertForSequenceClassification"]),
    ([123], ["architectures", "not a list of model class names"]),
    ("BertModel", ["architectures", "a string"]),
    ({"a": 1}, ["architectures", "an object"]),
])
def test_pruned_folder_architectures_not_a_model_class(tmp_path, pruned_folder, architectures, words):
    folder = tmp_path / "p"
    shutil.copytree(pruned_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = architectures
    (folder / "config.json").write_text(json.dumps(config))
    assert_refused(invoke("info", folder), folder / "config.json", *words)


def test_the_untouched_pruned_folder_still_loads(pruned_folder):
    res = invoke("info", pruned_folder)
    assert res.exit_code == 0, res.output


def test_every_attribute_a_cut_changes_is_allowed_and_the_copied_file_agrees():
    """The whitelist is what the cutters declare; the file copied into folders lists the same names."""
    from diagnose.prune import _remote_model
    from diagnose.prune.cut import ATTRIBUTES

    assert _remote_model.ATTRIBUTES == set(ATTRIBUTES)
    with pytest.raises(ValueError, match="forward"):
        _remote_model.shrink(torch.nn.Linear(2, 2), {"shapes": {}, "attributes": {"": {"forward": 1}}})
