"""Reading and writing the model and data files named in DESIGN.md.

Exported: the public loaders (load_model, load_data, load_data_for, DataSet, ImageSet, save_checkpoint),
what the CLI commands use (check_task, describe_model, describe_data, trial_forward), and what
another part of diagnose uses to teach load_model a folder kind it writes (FolderKind,
register_folder_kind, weight_shapes: see _kinds.py), the torch-free file readers the report and
the run folder use (parse_json, read_json, read_bytes, iter_lines, require_file), and save_tensors,
vocab_size_of. The rest (the label checks, the tokenizer lookups) stays in its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# Imported on first use (PEP 562): the report reads files through io's readers (_read.py) and must
# not pay for torch (about 300 MB and seconds) to do so.
_HOMES = {"save_checkpoint": "_checkpoint", "DataSet": "_data", "ImageSet": "_images", "check_task": "_data",
          "load_data": "_data",
          "load_data_for": "_data",
          "label2id_of": "_model", "load_model": "_model", "max_positions_of": "_model", "tokenizer_of": "_model",
          "describe_data": "_summary", "describe_model": "_summary", "trial_forward": "_summary",
          "FolderKind": "_kinds", "register_folder_kind": "_kinds", "unregister_folder_kind": "_kinds",
          "weight_shapes": "_hf", "can_checkpoint": "_checkpoint",
          "iter_lines": "_read", "parse_json": "_read", "read_bytes": "_read", "read_json": "_read",
          "require_file": "_read", "save_tensors": "_data", "vocab_size_of": "_model",
          "resolve_factory": "_factory"}

if TYPE_CHECKING:
    from ._checkpoint import can_checkpoint, save_checkpoint
    from ._data import DataSet, check_task, load_data, load_data_for, save_tensors
    from ._images import ImageSet
    from ._factory import resolve_factory
    from ._hf import weight_shapes
    from ._kinds import FolderKind, register_folder_kind, unregister_folder_kind
    from ._model import label2id_of, load_model, max_positions_of, tokenizer_of, vocab_size_of
    from ._read import iter_lines, parse_json, read_bytes, read_json, require_file
    from ._summary import describe_data, describe_model, trial_forward


__getattr__, __dir__ = lazy_names(__name__, {k: f".{v}" for k, v in _HOMES.items()})


__all__ = [
    "DataSet", "ImageSet", "check_task", "describe_data", "describe_model", "load_data", "load_data_for", "load_model",
    "save_checkpoint", "trial_forward",
    "FolderKind", "can_checkpoint", "register_folder_kind", "unregister_folder_kind", "weight_shapes",
    # torch-free file readers (the report and the run folder read through them), and what the demo and checks use
    "iter_lines", "parse_json", "read_bytes", "read_json", "require_file", "save_tensors", "vocab_size_of",
    "max_positions_of",
    # "module:function" imported as --factory, --forward and `stats --replay --loss` name user code
    "resolve_factory",
]
