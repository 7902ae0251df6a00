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


def can_checkpoint(model: Any) -> bool:
    """Whether save_checkpoint can write `model` (a diagnose.zoo.Transformer): a writer that keeps
    each model in the form it came in asks this, without knowing the model class."""
    return isinstance(model, Transformer)


def save_checkpoint(model: Transformer, path: str | Path, *, meta: dict[str, Any] | None = None) -> Path:
    """Write `model` (a diagnose.zoo.Transformer) as a diagnose checkpoint; returns the path."""
    if not can_checkpoint(model):
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


# Buffers that are not in the state_dict (position tables) grow with max_len; nothing else does
# once the config agrees with the weights' shapes.
_MAX_POSITIONS = 1 << 20


def model_from_checkpoint(obj: dict[str, Any], source: str | Path) -> Transformer:
    """Build the reference model from an already-loaded checkpoint dict.

    The config is checked against the state_dict's shapes on the meta device first (no memory
    allocated), so a config claiming 10**9 layers is refused in milliseconds, not built.
    """
    fix = "re-save it with diagnose.save_checkpoint"
    state, meta = obj.get("state_dict"), obj.get("meta")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise InputFileError(f"{source}: damaged diagnose checkpoint (state_dict is not a dict of tensors); {fix}")
    if meta is not None and not isinstance(meta, dict):
        raise InputFileError(f"{source}: damaged diagnose checkpoint (meta is a {type(meta).__name__}, not a dict); "
                             f"{fix}")
    try:
        cfg = ModelConfig.from_dict(obj.get("config"))
    except ConfigError as exc:
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config: {exc}); {fix}") from None
    _check_shapes(cfg, state, source, fix)
    model = Transformer(cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # dtypes, ... (shapes and names were checked above)
        raise InputFileError(f"{source}: damaged diagnose checkpoint ({one_line(exc)}); {fix}") from None
    model.diagnose_meta = dict(meta or {})
    return model.eval()


def _check_shapes(cfg: ModelConfig, state: dict[str, torch.Tensor], source: str | Path, fix: str) -> None:
    """Raise InputFileError unless the config builds exactly the tensors the state_dict holds."""
    blocks = {k.split(".")[1] for k in state if k.startswith("blocks.")}
    if cfg.n_layers != len(blocks):
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config says n_layers={cfg.n_layers}, the "
                             f"weights hold {len(blocks)} blocks); {fix}")
    emb = state.get("tok_emb.weight")
    if emb is None or tuple(emb.shape) != (cfg.vocab_size, cfg.d_model):
        found = "no tok_emb.weight" if emb is None else f"tok_emb.weight {tuple(emb.shape)}"
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config says vocab_size={cfg.vocab_size}, "
                             f"d_model={cfg.d_model}; the weights hold {found}); {fix}")
    fc = state.get("blocks.0.mlp.fc.weight")
    if fc is not None and tuple(fc.shape) != (cfg.ff_dim, cfg.d_model):
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config says d_ff={cfg.ff_dim}, the weights "
                             f"hold blocks.0.mlp.fc.weight {tuple(fc.shape)}); {fix}")
    if cfg.max_len > _MAX_POSITIONS:
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config says max_len={cfg.max_len}, over "
                             f"{_MAX_POSITIONS:,}); {fix}")
    with torch.device("meta"):
        skeleton = Transformer(cfg)
    expected = skeleton.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        k = (wrong or missing or unexpected)[0]
        what = (f"{k} is {tuple(state[k].shape)}, the config makes it {tuple(expected[k].shape)}" if wrong
                else f"{k} is missing" if missing else f"{k} is not part of the model")
        raise InputFileError(f"{source}: damaged diagnose checkpoint (config and weights disagree: {what}); {fix}")
