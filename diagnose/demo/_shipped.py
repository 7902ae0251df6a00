"""The demo's three main models, trained once and shipped in the package.

Why ship them: a few hundred Adam steps amplify the last bit of every float sum, and torch's CPU
kernels round differently on each kernel path (ATEN_CPU_CAPABILITY default, avx2, avx512) and
thread count. Trained on the spot, the same seed grows a different model on each machine, and a
lesson about *which* head carries the task (and which one only looks as if it does) would hinge
on the CPU. Shipped, every machine ablates the same weights: inference rounds differently too,
but by ~1e-6 of the outputs, far inside the margins the verdicts are judged with.

`python -m diagnose.demo.make_models` remakes them (weights, the TrainingMonitor run recorded
while each trained, and models/manifest.json with every file's sha256 and the recipe); loading
checks each hash and that the recipe is still the one in demo_variants(), so a shipped model can
be neither damaged nor stale without saying so. The lessons about training still train.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .._write import atomic_write
from ..errors import DiagnoseError
from ..zoo import ModelConfig, TaskData, Transformer

MODELS_DIR = Path(__file__).parent / "models"
MANIFEST = "manifest.json"
SCHEMA = "diagnose.demo-models/1"
RUN_FILES = ("run.json", "metrics.jsonl", "alerts.jsonl")
_REMAKE = "python -m diagnose.demo.make_models"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def data_sha256(data: TaskData) -> str:
    """One hash over the eval tensors (int64, C order): the data the shipped verdicts were measured on."""
    h = hashlib.sha256()
    for key, t in sorted(data.tensors().items()):
        h.update(key.encode())
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def recipe(v: Any) -> dict[str, Any]:
    """What a variant is trained from (task, model config, training config), as plain JSON."""
    return {"task": v.task, "model": v.model.to_dict(), "train": json.loads(json.dumps(asdict(v.train)))}


def manifest(models_dir: Path = MODELS_DIR) -> dict[str, Any]:
    path = models_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DiagnoseError(f"{path}: the demo's shipped models are missing or damaged ({exc}); "
                            f"reinstall diagnose, or remake them with `{_REMAKE}`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("models"), dict):
        raise DiagnoseError(f"{path}: not a {SCHEMA} manifest; reinstall diagnose or run `{_REMAKE}`")
    return data


def load(v: Any, eval_data: TaskData, models_dir: Path = MODELS_DIR) -> tuple[Transformer, dict[str, Any]]:
    """The shipped model of variant v, checked file by file against the manifest; (model, its entry)."""
    entry = manifest(models_dir)["models"].get(v.name)
    where = models_dir / MANIFEST
    if entry is None:
        raise DiagnoseError(f"{where}: no shipped model named {v.name!r}; run `{_REMAKE}`")
    if entry.get("recipe") != recipe(v):
        raise DiagnoseError(f"{where}: the shipped {v.name!r} model was trained from another recipe than "
                            f"demo_variants() now gives; run `{_REMAKE}` to retrain it")
    for rel, digest in entry.get("files", {}).items():
        path = models_dir / rel
        if not path.is_file() or sha256(path) != digest:
            raise DiagnoseError(f"{path}: missing or changed (sha256 differs from {where}); reinstall diagnose "
                                f"or run `{_REMAKE}`")
    if entry.get("eval_sha256") != data_sha256(eval_data):
        raise DiagnoseError(f"the {v.task!r} eval data generated on this machine differs from the data the shipped "
                            f"{v.name!r} model was measured on ({where}); please report this as a bug")
    from safetensors.torch import load_file

    model = Transformer(ModelConfig.from_dict(entry["recipe"]["model"]))
    model.load_state_dict(load_file(str(models_dir / entry["weights"])))
    return model.eval(), entry


def copy_run(src: Path, run_dir: Path) -> Path:
    """Lay a recorded run (its run.json, metrics and alerts) into run_dir, replacing what was there."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for name in RUN_FILES:
        if (src / name).is_file():
            atomic_write(run_dir / name, (src / name).read_bytes(), what="demo run")
    return run_dir
