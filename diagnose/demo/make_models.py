"""Remake the demo's shipped models: `python -m diagnose.demo.make_models [--out FOLDER] [--only NAME ...]`.

Trains each of demo_variants() from its seed under TrainingMonitor on one CPU thread, exactly as
the demo once trained them on the spot, and writes into FOLDER (default: the package's
diagnose/demo/models): <name>.safetensors (weights), <name>-run/ (the run recorded while it
trained) and manifest.json (recipe, eval accuracy and loss, the machine it ran on, each file's
sha256, the eval data's sha256). A maintainer runs it when a recipe changes and commits the result;
another machine gives other weights (see _shipped.py), which is why the weights are shipped.
`--only NAME` remakes those models alone and keeps the others' files and manifest entries as they
are (a remade entry carries its own `made`: the machine and date it was trained on).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import stat
import platform
import sys
import tempfile
from pathlib import Path

import torch

from .. import _json
from ..errors import ConfigError, DiagnoseError, OutputError
from .._write import atomic_write
from . import _shipped
from ._lessons import train_variant
from ._run import demo_variants


def make(out: Path, only: list[str] | None = None) -> Path:
    """Train demo_variants() (or those named in `only`) into `out`; returns the manifest's path."""
    from safetensors.torch import save

    _folder(out)
    names = [v.name for v in demo_variants()]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ConfigError(f"--only {unknown[0]!r}: no demo model of that name; the demo's models are {', '.join(names)}")
    kept = _shipped.manifest(out)["models"] if only else {}
    made = {"command": "python -m diagnose.demo.make_models", "torch": torch.__version__,
            "kernel_path": torch.backends.cpu.get_cpu_capability(), "threads": 1,
            "python": platform.python_version(), "machine": platform.machine(),
            "date": _dt.date.today().isoformat()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    models = {n: kept[n] for n in names if n in kept and n not in only} if only else {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for v in (v for v in demo_variants() if not only or v.name in only):
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
                if only:
                    models[v.name]["made"] = made
                print(f"  {v.name:10s} accuracy {t.accuracy:.3f}  loss {t.loss:.4f}")
    finally:
        torch.set_num_threads(threads)
    models = {n: models[n] for n in names if n in models}  # the demo's order
    top = _shipped.manifest(out).get("made", made) if only else made  # the whole set's; a remade entry has its own
    path = out / _shipped.MANIFEST
    return atomic_write(path, _json.dumps({"schema": _shipped.SCHEMA, "made": top, "models": models}, indent=1) + "\n",
                        what="demo manifest")


def _folder(out: Path) -> None:
    """Make `out` (and its parents), or one OutputError saying why not: a file or a dangling symlink in its place,
    a parent that is a file, no permission."""
    if out.is_symlink() and not out.exists():
        raise OutputError(f"{out}: is a symlink to {os.readlink(out)!r}, which does not exist; remove the link or "
                          f"give --out a folder to write the models into")
    if out.exists() and not out.is_dir():
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(os.stat(out).st_mode) else "a file"
        raise OutputError(f"{out}: is {kind}, not a folder; give --out a folder to write the models into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out}: cannot be made ({exc.strerror}); give --out a folder you can write") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diagnose.demo.make_models", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=_shipped.MODELS_DIR, help="folder to write (default: %(default)s)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="remake these models alone, keep the others")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {make(args.out, args.only)}")
    except DiagnoseError as exc:  # one line and exit code 2, as the CLI says its errors
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
