"""Kinds of Hugging Face folder that another part of diagnose writes and teaches load_model to read.

A kind is marked by a `diagnose_*` field in config.json (prune writes `diagnose_pruned`). The
part that writes the kind registers it here (a FolderKind, in a `Registry` of diagnose/registry.py:
the field, and the function that gives the model class to build such a folder with); io itself imports none of those parts, so the layers
point one way. diagnose registers its own kinds when the package is imported (diagnose/__init__.py),
before any io code can run. A folder with a `diagnose_*` field no registered kind claims is refused:
transformers would otherwise build the family's plain class and ignore what the field says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, InputFileError
from ..registry import Registry

PREFIX = "diagnose_"


@dataclass(frozen=True)
class FolderKind:
    """field: the config.json field that marks the kind ("diagnose_pruned"). model_class(folder,
    config, cls, transformers): the class to build the folder with, given the class its
    `architectures` names; it checks the field first and raises InputFileError when it is wrong."""

    field: str
    model_class: Callable[[Path, Any, Any, Any], Any]


def _check(kind: FolderKind) -> None:
    if not (isinstance(kind.field, str) and kind.field.startswith(PREFIX)):
        raise ConfigError(f"folder kind field {kind.field!r} must start with {PREFIX!r}")


# field -> kind; io declares no built-in kind (those are registered by the parts that write them)
REGISTRY: Registry[FolderKind] = Registry("folder kind", key=lambda k: k.field, check=_check)
_KINDS = REGISTRY.mapping()  # the older name, read as a dict


def register_folder_kind(kind: FolderKind) -> FolderKind:
    """Teach load_model a folder kind (the latest registration for a field wins)."""
    return REGISTRY.register(kind, replace=True)


def unregister_folder_kind(kind: FolderKind) -> None:
    """Undo register_folder_kind (tests)."""
    if kind.field in REGISTRY and REGISTRY.get(kind.field) is kind:
        REGISTRY.unregister(kind.field)


def folder_kind(folder: Path, config: Any) -> FolderKind | None:
    """The registered kind whose field the config holds, None for a plain folder; InputFileError for
    a `diagnose_*` field that no kind claims."""
    fields = sorted(k for k in vars(config) if k.startswith(PREFIX))
    unknown = [f for f in fields if f not in REGISTRY]
    if unknown:
        raise InputFileError(f"{folder / 'config.json'}: has {unknown[0][:80]!r}, a field this version of diagnose "
                             "does not read; upgrade diagnose, or load the folder with the program that wrote it")
    return REGISTRY.get(fields[0]) if fields else None
