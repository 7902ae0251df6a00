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
_FIX = f"reinstall diagnose, or remake them with `{_REMAKE}`"
MAX_MANIFEST_BYTES = 1 << 20  # the manifest is a few KB
MAX_FILE_BYTES = 256 << 20  # a shipped weight file is well under 1 MB


def sha256(path: Path) -> str:
    return hashlib.sha256(_read(path)).hexdigest()


def _read(path: Path) -> bytes:
    """A shipped file's bytes through the bounded regular-file reader (a FIFO or /dev/zero is refused)."""
    from ..io import read_bytes

    return read_bytes(path, "demo model file", limit=MAX_FILE_BYTES)


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


def manifest(models_dir: Path | None = None) -> dict[str, Any]:
    """The manifest (of MODELS_DIR, read when called), read through the bounded regular-file reader and checked
    for its shape."""
    from ..io import read_json

    models_dir = MODELS_DIR if models_dir is None else models_dir
    path = models_dir / MANIFEST
    data = read_json(path, "demo models manifest", f"the demo's shipped models are missing or damaged: "
                     f"{_FIX}", limit=MAX_MANIFEST_BYTES)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("models"), dict):
        raise DiagnoseError(f"{path}: not a {SCHEMA} manifest; {_FIX}")
    return data


def _inside(models_dir: Path, rel: Any, where: Path, field: str) -> Path:
    """models_dir / rel, refused unless rel is a relative path that stays inside the package's folder
    (symlinks followed)."""
    root = models_dir.resolve()
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise DiagnoseError(f"{where}: {field} {rel!r:.80} is not a path inside {models_dir}; {_FIX}")
    path = models_dir / rel
    if not path.resolve().is_relative_to(root):
        raise DiagnoseError(f"{where}: {field} {rel!r:.80} leads outside {models_dir}; {_FIX}")
    return path


def _entry(models_dir: Path, name: str) -> dict[str, Any]:
    """The manifest's entry for `name`, every field this module reads type-checked; files hashed under
    `files`, weights and run among them, all inside models_dir."""
    where = models_dir / MANIFEST
    entry = manifest(models_dir)["models"].get(name)
    if entry is None:
        raise DiagnoseError(f"{where}: no shipped model named {name!r}; run `{_REMAKE}`")
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, dict) or not all(isinstance(d, str) and len(d) == 64 for d in files.values()):
        raise DiagnoseError(f"{where}: the entry of {name!r} is not an object whose `files` maps paths to "
                            f"sha256 digests; {_FIX}")
    for rel in files:
        _inside(models_dir, rel, where, "file")
    weights, run = entry.get("weights"), entry.get("run")
    _inside(models_dir, weights, where, "weights")
    _inside(models_dir, run, where, "run")
    unhashed = [r for r in [weights, *(f"{run}/{f}" for f in RUN_FILES if (models_dir / run / f).exists())]
                if r not in files]
    if unhashed:
        raise DiagnoseError(f"{where}: {unhashed[0]} of {name!r} has no sha256 under `files`, so it is not loaded; "
                            f"{_FIX}")
    return entry


def load(v: Any, eval_data: TaskData, models_dir: Path | None = None) -> tuple[Transformer, dict[str, Any]]:
    """The shipped model of variant v (in MODELS_DIR, read when called), checked file by file against the
    manifest; (model, its entry)."""
    models_dir = MODELS_DIR if models_dir is None else models_dir
    where = models_dir / MANIFEST
    entry = _entry(models_dir, v.name)
    if entry.get("recipe") != recipe(v):
        raise DiagnoseError(f"{where}: the shipped {v.name!r} model was trained from another recipe than "
                            f"demo_variants() now gives; run `{_REMAKE}` to retrain it")
    blobs = {}
    for rel, digest in entry["files"].items():
        path = models_dir / rel
        blobs[rel] = _read(path) if path.is_file() else None
        if blobs[rel] is None or hashlib.sha256(blobs[rel]).hexdigest() != digest:
            raise DiagnoseError(f"{path}: missing or changed (sha256 differs from {where}); {_FIX}")
    if entry.get("eval_sha256") != data_sha256(eval_data):
        raise DiagnoseError(f"the {v.task!r} eval data generated on this machine differs from the data the shipped "
                            f"{v.name!r} model was measured on ({where}); please report this as a bug")
    from safetensors.torch import load as load_bytes

    model = Transformer(ModelConfig.from_dict(entry["recipe"]["model"]))
    try:  # the very bytes that were hashed: the file cannot change between the check and the load
        model.load_state_dict(load_bytes(blobs[entry["weights"]]))
    except Exception as exc:  # noqa: BLE001 - a hashed file that still does not load: one line, not a traceback
        raise DiagnoseError(f"{models_dir / entry['weights']}: does not load into the {v.name!r} model "
                            f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); {_FIX}") from None
    return model.eval(), entry


def copy_run(src: Path, run_dir: Path) -> Path:
    """Lay a recorded run (its run.json, metrics and alerts) into run_dir, replacing what was there."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for name in RUN_FILES:
        if (src / name).is_file():
            atomic_write(run_dir / name, _read(src / name), what="demo run")
    return run_dir
