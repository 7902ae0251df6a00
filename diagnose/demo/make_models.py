"""Remake the demo's shipped models: `python -m diagnose.demo.make_models [--out FOLDER]`.

Trains each of demo_variants() from its seed under TrainingMonitor on one CPU thread, exactly as
the demo once trained them on the spot, and writes into FOLDER (default: the package's
diagnose/demo/models): <name>.safetensors (weights), <name>-run/ (the run recorded while it
trained) and manifest.json (recipe, eval accuracy and loss, the machine it ran on, each file's
sha256, the eval data's sha256). A maintainer runs it when a recipe changes and commits the result;
another machine gives other weights (see _shipped.py), which is why the weights are shipped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import sys
import tempfile
from pathlib import Path

import torch

from .. import _json
from ..errors import DiagnoseError, OutputError
from .._write import atomic_write
from . import _shipped
from ._lessons import train_variant
from ._run import demo_variants


def make(out: Path) -> Path:
    from safetensors.torch import save

    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: is a file, not a folder; give --out a folder to write the models into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out}: cannot be made ({exc.strerror}); give --out a folder you can write") from None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    models = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for v in demo_variants():
                t = train_variant(v, Path(tmp), {})
                weights, run = f"{v.name}.safetensors", f"{v.name}-run"
                atomic_write(out / weights, save({k: w.detach().contiguous() for k, w in t.model.state_dict().items()}),
                             what="demo weights")
                _shipped.copy_run(t.run_dir, out / run)
                files = [weights] + [f"{run}/{f}" for f in _shipped.RUN_FILES if (out / run / f).is_file()]
                models[v.name] = {"recipe": _shipped.recipe(v), "weights": weights, "run": run,
                                  "eval_accuracy": t.accuracy, "eval_loss": t.loss,
                                  "eval_sha256": _shipped.data_sha256(t.eval_data),
                                  "files": {f: _shipped.sha256(out / f) for f in files}}
                print(f"  {v.name:10s} accuracy {t.accuracy:.3f}  loss {t.loss:.4f}")
    finally:
        torch.set_num_threads(threads)
    made = {"command": "python -m diagnose.demo.make_models", "torch": torch.__version__,
            "kernel_path": torch.backends.cpu.get_cpu_capability(), "threads": 1,
            "python": platform.python_version(), "machine": platform.machine(),
            "date": _dt.date.today().isoformat()}
    path = out / _shipped.MANIFEST
    return atomic_write(path, _json.dumps({"schema": _shipped.SCHEMA, "made": made, "models": models}, indent=1) + "\n",
                        what="demo manifest")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diagnose.demo.make_models", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=_shipped.MODELS_DIR, help="folder to write (default: %(default)s)")
    try:
        print(f"wrote {make(parser.parse_args(argv).out)}")
    except DiagnoseError as exc:  # one line and exit code 2, as the CLI says its errors
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
