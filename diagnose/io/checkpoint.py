"""The diagnose checkpoint: torch.save of plain data -- format tag, config dict, state_dict,
and optional metadata -- so that it loads with weights_only=True and runs no code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._write import atomic_write
from ..errors import ConfigError, InputFileError
from ..zoo import ModelConfig, Transformer
from ._files import one_line

FORMAT = "diagnose.checkpoint/1"


def save_checkpoint(model: Transformer, path: str | Path, *, meta: dict[str, Any] | None = None) -> Path:
    """Write `model` (a diagnose.zoo.Transformer) as a diagnose checkpoint; returns the path."""
    if not isinstance(model, Transformer):
        raise ConfigError(f"save_checkpoint writes diagnose.zoo.Transformer models, not {type(model).__name__}; "
                          "save your own model with torch.save(model.state_dict(), path) and load it with "
                          "--factory module:function")
    payload = {
        "format": FORMAT,
        "config": model.cfg.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "meta": dict(meta or {}),
    }
    return atomic_write(path, lambda f: torch.save(payload, f), what="checkpoint")


def is_checkpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def model_from_checkpoint(obj: dict[str, Any], source: str | Path) -> Transformer:
    """Build the reference model from an already-loaded checkpoint dict."""
    try:
        model = Transformer(ModelConfig.from_dict(obj["config"]))
        model.load_state_dict(obj["state_dict"])
    except (KeyError, RuntimeError, TypeError) as exc:
        raise InputFileError(f"{source}: damaged diagnose checkpoint ({one_line(exc)}); re-save it with "
                             "diagnose.save_checkpoint") from None
    model.diagnose_meta = dict(obj.get("meta") or {})
    return model.eval()
