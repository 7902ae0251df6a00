"""Reading and writing the model and data files named in DESIGN.md.

Exported: the public loaders (load_model, load_data, DataSet, save_checkpoint) and what the CLI
commands use (load_data_for, check_task, describe_model, describe_data, trial_forward), and what
another part of diagnose uses to teach load_model a folder kind it writes (FolderKind,
register_folder_kind, weight_shapes: see _kinds.py). The rest
(save_tensors, the vocabulary and label checks, the tokenizer lookups) stays in its module.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562): the report reads files through io._read and must not pay for
# torch (about 300 MB and seconds) to do so.
_HOMES = {"save_checkpoint": "_checkpoint", "DataSet": "_data", "check_task": "_data", "load_data": "_data",
          "label2id_of": "_model", "load_model": "_model", "max_positions_of": "_model", "tokenizer_of": "_model",
          "describe_data": "_summary", "describe_model": "_summary", "trial_forward": "_summary",
          "FolderKind": "_kinds", "register_folder_kind": "_kinds", "unregister_folder_kind": "_kinds",
          "weight_shapes": "_hf", "can_checkpoint": "_checkpoint"}

if TYPE_CHECKING:
    from ._checkpoint import can_checkpoint, save_checkpoint
    from ._data import DataSet, check_task, load_data
    from ._hf import weight_shapes
    from ._kinds import FolderKind, register_folder_kind, unregister_folder_kind
    from ._model import label2id_of, load_model, max_positions_of, tokenizer_of
    from ._summary import describe_data, describe_model, trial_forward


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_data_for(model, path, *, max_length=None) -> DataSet:
    """load_data with the model's tokenizer and label names (what the CLI commands use).

    Text is truncated to max_length tokens, by default the model's maximum positions (and the
    tokenizer's limit, when lower).
    """
    from ._data import load_data
    from ._model import label2id_of, max_positions_of, tokenizer_of

    return load_data(path, tokenizer=tokenizer_of(model), max_length=max_length, label2id=label2id_of(model),
                     model_max_length=max_positions_of(model))


__all__ = [
    "DataSet", "check_task", "describe_data", "describe_model", "load_data", "load_data_for", "load_model",
    "save_checkpoint", "trial_forward",
    "FolderKind", "can_checkpoint", "register_folder_kind", "unregister_folder_kind", "weight_shapes",
]
