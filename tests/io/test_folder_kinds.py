"""Folder kinds: a part of diagnose that writes a `diagnose_*` field into a Hugging Face folder's
config teaches load_model to read it (io.register_folder_kind); io imports none of those parts.
diagnose registers its own (the pruned folder) on import, without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diagnose.errors import ConfigError, InputFileError
from diagnose.io import FolderKind, load_model, register_folder_kind, unregister_folder_kind

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")


def _with_field(folder, tmp_path, field):
    """A copy of the folder whose config.json holds `field`."""
    import shutil

    copy = tmp_path / "marked"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config[field] = {"any": 1}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_registered_kind_picks_the_class_its_folders_are_built_with(bert_folder, tmp_path):
    folder, _ = bert_folder
    marked = _with_field(folder, tmp_path, "diagnose_toy")
    seen = []

    def model_class(where, config, cls, _transformers):
        seen.append((where, config.diagnose_toy, cls.__name__))
        return cls

    kind = register_folder_kind(FolderKind("diagnose_toy", model_class))
    try:
        model = load_model(marked)
    finally:
        unregister_folder_kind(kind)
    assert seen == [(marked, {"any": 1}, "BertForSequenceClassification")]
    assert type(model).__name__ == "BertForSequenceClassification"


def test_a_diagnose_field_no_kind_claims_is_refused(bert_folder, tmp_path):
    marked = _with_field(bert_folder[0], tmp_path, "diagnose_future")
    with pytest.raises(InputFileError, match="'diagnose_future', a field this version of diagnose does not read"):
        load_model(marked)


def test_a_kind_s_field_is_a_diagnose_field():
    with pytest.raises(ConfigError, match="must start with 'diagnose_'"):
        register_folder_kind(FolderKind("pruned", lambda *a: None))


def test_importing_diagnose_registers_the_pruned_folder_without_torch():
    """io never imports prune, and nothing else may be needed first: the package's own import
    registers the kind (what `from diagnose.io import load_model` always runs first)."""
    code = ("import sys\nfrom diagnose.io import _kinds\n"
            "print('diagnose_pruned' in _kinds._KINDS, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]
