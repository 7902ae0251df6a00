"""Checking a pruned folder's `diagnose_pruned` config before the model is built.

The loader rebuilds a pruned Hugging Face folder by giving parameters the shapes the config
lists and setting the module attributes it lists (_remote_model.shrink). The config is input like
any other: it could name a method (`forward`), a module that is not there, or head counts of 0
or 10**9. So before anything is built, every entry is checked: attribute names only from what
a cut writes (cut.ATTRIBUTES, read from the built-in families' layouts), values plain integers,
each shape equal to the weights file's, each feature count equal to its weight's dimension, head
counts (cut.HEAD_COUNTS) within the config's.
Every refusal is one InputFileError naming config.json, the entry and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._numbers import kind
from ..errors import InputFileError
from .cut import ATTRIBUTES, HEAD_COUNTS, WIDTHS

_FIX = "prune the original model again (diagnose prune ... --out DIR)"
_KEYS = ("shapes", "attributes", "heads_left")
MAX_ENTRIES = 1 << 16


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_pruned(folder: Path, spec: Any, config: Any, shapes: dict[str, list[int]] | None) -> None:
    """Raise InputFileError unless `spec` (config.diagnose_pruned) is what the cutter writes and
    agrees with the weights' `shapes` ({name: shape} from the safetensors headers)."""
    where = f"{folder / 'config.json'}: diagnose_pruned"

    def bad(what: str) -> InputFileError:
        return InputFileError(f"{where}{what}; {_FIX}")

    if not isinstance(spec, dict) or set(spec) - set(_KEYS) or not all(k in spec for k in _KEYS):
        raise bad(f" must be an object with exactly {', '.join(_KEYS)}")
    if shapes is None:
        raise bad(" needs the weights in model.safetensors (their shapes are checked before loading)")
    new_shapes, attributes, heads_left = spec["shapes"], spec["attributes"], spec["heads_left"]
    if not isinstance(new_shapes, dict) or not isinstance(attributes, dict) or not isinstance(heads_left, list):
        raise bad(": shapes and attributes must be objects, heads_left a list")
    if len(new_shapes) + len(attributes) > MAX_ENTRIES:
        raise bad(f" lists over {MAX_ENTRIES:,} entries")
    for name, shape in new_shapes.items():
        if not name.endswith((".weight", ".bias")):
            raise bad(f".shapes names {name[:80]!r}; only weights and biases are reshaped")
        if not (isinstance(shape, list) and all(_int(d) and d >= 0 for d in shape)):
            raise bad(f".shapes[{name!r}] is {kind(shape)}, not a list of sizes")
        if shapes.get(name) != shape:
            raise bad(f".shapes[{name!r}] is {shape}, but the weights hold "
                      f"{shapes[name] if name in shapes else 'no such tensor'}")
    n_heads = _config_int(config, "num_attention_heads")
    widest = max((max(s, default=0) for s in shapes.values()), default=0)
    for owner, attrs in attributes.items():
        _check_module(owner, attrs, shapes, n_heads, widest, bad)
    n_layers = _config_int(config, "num_hidden_layers")
    if not all(_int(h) and 0 <= h <= (n_heads or h) for h in heads_left) or (
            n_layers is not None and len(heads_left) != n_layers):
        layers = f"each of its {n_layers} layers" if n_layers is not None else "each layer"
        raise bad(f".heads_left must give the heads left in {layers}, integers from 0 to "
                  f"{n_heads if n_heads is not None else 'the heads per layer'}")


def _check_module(owner: Any, attrs: Any, shapes: dict[str, list[int]], n_heads: int | None, widest: int,
                  bad) -> None:
    """One module's attributes: allowed names, integers, each consistent with its weights."""
    if not isinstance(owner, str) or not any(name.startswith(owner + ".") for name in shapes):
        raise bad(f".attributes names {str(owner)[:80]!r}, a module with no weights in the folder")
    if not isinstance(attrs, dict):
        raise bad(f".attributes[{owner!r}] is {kind(attrs)}, not an object")
    for key, value in attrs.items():
        at = f".attributes[{owner!r}].{str(key)[:40]}"
        if key not in ATTRIBUTES:
            raise bad(f"{at}: only {', '.join(sorted(ATTRIBUTES))} may be set (what the cutter changes)")
        if not _int(value):
            raise bad(f"{at} is {kind(value)}, not an integer")
        weight = shapes.get(owner + ".weight")
        want = {"out_features": 0, "in_features": 1, "nx": 0, "nf": 1}.get(key)  # Linear [out, in], Conv1D [in, out]
        if want is not None and (weight is None or len(weight) != 2 or weight[want] != value):
            raise bad(f"{at} is {value}, but {owner}.weight has shape {weight}")
        if key in HEAD_COUNTS and not (1 <= value <= (n_heads or value)):
            raise bad(f"{at} is {value}, not a head count from 1 to {n_heads}")
        if key in WIDTHS and not (1 <= value <= widest):
            raise bad(f"{at} is {value}, wider than any weight in the folder")


def _config_int(config: Any, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if _int(value) and value > 0 else None
