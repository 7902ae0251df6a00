"""Writing the pruned model in the form it came in.

- Hugging Face model: a save_pretrained folder (with the tokenizer) whose config keeps the family
  and adds `diagnose_pruned` (the pruned shapes) and an `auto_map` to pruned_heads.py, so the
  Auto classes rebuild it without diagnose (with trust_remote_code=True), and diagnose's loader
  with its own copy of that code.
- reference model: a diagnose checkpoint (model.pt) whose config lists the heads per layer.
- anything else (a --factory model): model.pt, its state_dict, and heads.json with the heads left
  per layer: the factory must build the model with those counts.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import torch

from .._json import dumps
from .._write import check_output, process_umask, replace_atomically, write_error
from ..errors import OutputError
from ..io import can_checkpoint, save_checkpoint

REMOTE_FILE = "pruned_heads.py"
_AUTO = (("ForSequenceClassification", "AutoModelForSequenceClassification"), ("ForCausalLM", "AutoModelForCausalLM"),
         ("LMHeadModel", "AutoModelForCausalLM"), ("ForMaskedLM", "AutoModelForMaskedLM"),
         ("ForTokenClassification", "AutoModelForTokenClassification"), ("", "AutoModel"))


def check_folder(folder: Path, *, inputs: Iterable[Any] = (), option: str = "--out") -> None:
    """Refuse, before any work, a folder the pruned model cannot go to: one inside an input folder
    (the input model's own), a symbolic link, a file, a folder that is not empty (nothing is
    overwritten), or one in a folder this process cannot write to (the shared output guard)."""
    check_output(folder, inputs=[i for i in inputs if i is not None], option=option, folder=True)
    if folder.is_symlink():  # built beside its path and renamed into place: a link cannot be renamed onto
        raise OutputError(f"{folder}: {option} is a symbolic link to {os.path.realpath(folder)}; give the real "
                          "folder path, or a new one")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise OutputError(f"{folder}: exists and is not empty; name a new or empty folder for the pruned model")


def save_pruned(result, folder: Path, *, tokenizer: Any = None) -> dict[str, Any]:
    """Write result.model to folder; returns {"path", "form", "files"}.

    Everything is written into a hidden folder beside it, renamed into place at the end: a failure
    half-way leaves nothing behind. When the folder cannot be written (read-only, disk full, a path
    that changed since the check), the model is saved in the system's temporary folder instead and
    the OutputError names it, so that the pruning run is not lost (as atomic_write does for files)."""
    check_folder(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name[:32]}.", dir=folder.parent))
    except OSError as exc:
        raise _kept(result, folder, tokenizer, exc) from None
    try:
        saved = _write(result, work, tokenizer)
        work.chmod(0o777 & ~process_umask())  # mkdtemp's folder is private; the user's umask decides, as for mkdir
        if folder.exists():
            folder.rmdir()  # empty (check_folder): a folder can only be renamed onto an empty one
        work.rename(folder)
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise _kept(result, folder, tokenizer, exc) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"path": str(folder), **saved}


def _kept(result, folder: Path, tokenizer: Any, exc: OSError) -> OutputError:
    """The error for a pruned model that could not go to `folder`, after saving it in $TMPDIR."""
    spare = None
    try:
        spare = Path(tempfile.mkdtemp(prefix="diagnose-pruned-"))
        _write(result, spare, tokenizer)
        kept = f"; the pruned model was saved to {spare} instead"
    except OSError:
        if spare is not None:
            shutil.rmtree(spare, ignore_errors=True)
        kept = f"; it could not be saved in {tempfile.gettempdir()} either"
    return write_error(folder, "pruned model", exc, kept)


def _write(result, folder: Path, tokenizer: Any) -> dict[str, Any]:
    """Every file of the pruned model into `folder` (a staging folder save_pruned renames into place)."""
    model = result.model
    if hasattr(model, "save_pretrained") and hasattr(model, "config"):
        form = "Hugging Face folder"
        _save_hf(result, folder, tokenizer if tokenizer is not None else getattr(model, "diagnose_tokenizer", None))
    elif can_checkpoint(model):
        form = "diagnose checkpoint"
        save_checkpoint(model, folder / "model.pt", meta=dict(getattr(model, "diagnose_meta", None) or {}))
    else:
        form = "state_dict + factory"
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        replace_atomically(folder / "model.pt", lambda f: torch.save(state, f))
    heads = {"schema": "diagnose.pruned_heads/1", "heads_left": result.heads_left,
             "removed": [list(h) for h in result.removed]}
    replace_atomically(folder / "heads.json", dumps(heads, indent=1) + "\n")
    return {"form": form, "files": sorted(p.name for p in folder.iterdir())}


def _save_hf(result, folder: Path, tokenizer: Any) -> None:
    model = result.model
    arch = type(model).__name__
    auto = next(a for suffix, a in _AUTO if arch.endswith(suffix))
    original_config = model.config
    config = copy.deepcopy(original_config)
    config.diagnose_pruned = {"shapes": result.cut.shapes, "attributes": result.cut.attributes,
                              "heads_left": result.heads_left}
    config.auto_map = {auto: "pruned_heads.PrunedModel"}
    model.config = config
    try:
        model.save_pretrained(folder)
    finally:
        model.config = original_config
    source = (Path(__file__).parent / "_remote_model.py").read_text(encoding="utf-8")
    replace_atomically(folder / REMOTE_FILE, source.replace("BASE = None", f'BASE = "{arch}"', 1))
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
