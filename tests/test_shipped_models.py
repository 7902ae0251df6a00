"""The demo's shipped models: what the manifest says is what ships (hashes, recipes), a changed
file or a stale recipe is refused by name, and make_models writes what the loader accepts."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from diagnose.demo import _shipped, demo_variants, shipped_variant
from diagnose.demo import make_models as mm
from diagnose.errors import DiagnoseError
from diagnose.demo._lessons import _split
from diagnose.monitor import read_run

pytestmark = pytest.mark.numerics


def test_every_demo_model_ships_with_its_recipe_hashes_and_run(tmp_path: Path):
    made = _shipped.manifest()
    assert set(made["models"]) == {v.name for v in demo_variants()}
    assert made["made"]["command"] == "python -m diagnose.demo.make_models" and made["made"]["threads"] == 1
    for v in demo_variants():
        t = shipped_variant(v, tmp_path / "runs", {})
        entry = made["models"][v.name]
        assert entry["recipe"] == _shipped.recipe(v)
        # measured here against measured where it was made: inference rounding may at most flip a unit that
        # sits on the decision boundary, so allow two flips of the scored units (not a float tolerance)
        units = int((t.eval_data.labels != -100).sum())
        assert abs(t.accuracy - entry["eval_accuracy"]) <= 2 / units and t.accuracy > 0.95, v.name
        run = read_run(t.run_dir)
        assert len(run.steps) == v.train.steps and run.steps["step"].iloc[-1] == v.train.steps - 1


def _copy(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    shutil.copytree(_shipped.MODELS_DIR, models)
    return models


def test_a_changed_weight_file_is_refused_by_name(tmp_path: Path):
    models = _copy(tmp_path)
    v = demo_variants()[1]
    weights = models / _shipped.manifest(models)["models"][v.name]["weights"]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    _, ev = _split(v, {})
    with pytest.raises(DiagnoseError, match=rf"{weights.name}: missing or changed .*reinstall diagnose"):
        _shipped.load(v, ev, models)


def test_a_recipe_that_moved_on_is_refused(tmp_path: Path):

    v = demo_variants()[0]
    stale = replace(v, train=replace(v.train, steps=v.train.steps + 1))
    with pytest.raises(DiagnoseError, match="another recipe .*make_models"):
        _shipped.load(stale, _split(v, {})[1])
    with pytest.raises(DiagnoseError, match="damaged"):
        (tmp_path / "manifest.json").write_text("{")
        _shipped.manifest(tmp_path)


@pytest.mark.slow
def test_make_models_writes_what_the_loader_accepts(tmp_path: Path, monkeypatch):

    short = [replace(v, train=replace(v.train, steps=20)) for v in demo_variants()]
    monkeypatch.setattr(mm, "demo_variants", lambda: short)
    path = mm.make(tmp_path)
    made = json.loads(path.read_text())
    assert made["made"]["kernel_path"] and made["made"]["torch"]
    for v in short:
        model, entry = _shipped.load(v, _split(v, {})[1], tmp_path)
        assert set(entry["files"]) == {f"{v.name}.safetensors", *(f"{v.name}-run/{f}" for f in _shipped.RUN_FILES)}
        assert sum(p.numel() for p in model.parameters()) > 0
    # --only remakes the one named and keeps every file and entry of the others as they were
    kept = {v.name: (tmp_path / f"{v.name}.safetensors").read_bytes() for v in short}
    again = [replace(v, train=replace(v.train, steps=21)) if v.name == "padding" else v for v in short]
    monkeypatch.setattr(mm, "demo_variants", lambda: again)
    remade = json.loads(mm.make(tmp_path, only=["padding"]).read_text())
    assert remade["made"] == made["made"] and remade["models"]["padding"]["made"]["torch"]
    assert {k: v for k, v in remade["models"].items() if k != "padding"} == {k: v for k, v in made["models"].items()
                                                                           if k != "padding"}
    assert all((tmp_path / f"{n}.safetensors").read_bytes() == b for n, b in kept.items() if n != "padding")
    assert remade["models"]["padding"]["recipe"]["train"]["steps"] == 21
    with pytest.raises(DiagnoseError, match="--only 'nope': no demo model of that name"):
        mm.make(tmp_path, only=["nope"])
