"""`--factory module:function` plus a state_dict file: the user's code builds the model, the
file only holds tensors (torch.save of a state_dict, loaded with weights_only=True, or .safetensors).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, InputFileError
from ._files import cwd_on_path, one_line, require_file, torch_load

# Training loops often wrap the state_dict: {"state_dict": ...} (Lightning), {"model": ...}.
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")


def resolve_factory(spec: str, *, option: str = "--factory") -> Callable[..., Any]:
    """Import `module:function` (module may be dotted or a path to a .py file; cwd is searched).

    option: the flag it came from, for the messages (--factory builds the model, --forward calls it)."""
    wants = {"--factory": "builds the model (with no arguments, or the checkpoint entries it names, e.g. model_args)",
             "--loss": "computes the loss: fn(model, batch) -> per-example loss [B]"}.get(
        option, "calls the model: fn(model, inputs) -> output")
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option} {spec!r}: expected module:function, e.g. mymodels:build_model")
    with cwd_on_path():
        try:
            module = _import(module_name, option)
        except ConfigError:
            raise
        except Exception as exc:  # the module's own import-time code can raise anything
            raise ConfigError(f"{option} {spec}: cannot import {module_name} ({type(exc).__name__}: "
                              f"{one_line(exc)}); run diagnose from the folder that holds it") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{option} {spec}: {module_name} has no {attr!r}; name a function that {wants}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{option} {spec}: {attr} is not callable; name a function that {wants}")
    return target


def _import(name: str, option: str = "--factory") -> Any:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"{option}: {path} does not exist")
        spec = importlib.util.spec_from_file_location(f"_diagnose_factory_{path.stem}", path)
        assert spec is not None and spec.loader is not None, f"no import spec for {path}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def read_state_dict(path: Path, *, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} from .safetensors or a torch.save file (weights_only=True unless trusted)."""
    return read_weights(path, trust_pickle=trust_pickle)[0]


def read_weights(path: Path, *, trust_pickle: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state_dict, the file's other entries): a training checkpoint such as nanoGPT's
    {'model': state_dict, 'model_args': {...}, 'iter_num': ..., 'config': {...}, ...} gives its
    state_dict and {'model_args': ..., 'iter_num': ..., 'config': ..., ...}; a bare state_dict, {}."""
    require_file(path, "state_dict file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device="cpu"), {}
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputFileError(f"{path}: not a readable safetensors file ({one_line(exc)}); "
                                 "write it with safetensors.torch.save_file(model.state_dict(), path)") from None
    obj = torch_load(path, what="state_dict file", trust_pickle=trust_pickle)
    extras: dict[str, Any] = {}
    from ._checkpoint import is_checkpoint
    if is_checkpoint(obj):
        obj = obj["state_dict"]
    elif isinstance(obj, Mapping) and not _is_tensor_dict(obj):
        key = next((k for k in _WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if key is not None:
            extras = {k: v for k, v in obj.items() if k != key and isinstance(k, str)}
            obj = obj[key]
    if not isinstance(obj, Mapping) or not _is_tensor_dict(obj):
        raise InputFileError(f"{path}: holds a {type(obj).__name__}, not a state_dict of tensors; "
                             "save it with torch.save(model.state_dict(), path)")
    return dict(obj), extras


def _is_tensor_dict(obj: Mapping) -> bool:
    return bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def model_from_factory(spec: str, path: Path, *, trust_pickle: bool = False) -> nn.Module:
    """Build the model with the factory, then load the file's state_dict strictly.

    The factory is called with the checkpoint's entries that its parameters name (see
    factory_arguments: nanoGPT's `def build(model_args)` gets the checkpoint's model_args). A
    state_dict saved from a compiled (`_orig_mod.`) or DDP-wrapped (`module.`) model loads when the
    rest of every name matches, with a note.
    """
    require_file(path, "state_dict file for --factory")
    build = resolve_factory(spec)
    state, extras = read_weights(path, trust_pickle=trust_pickle)
    kwargs = factory_arguments(build, extras, spec, path)
    try:
        model = build(**kwargs)
    except Exception as exc:  # user code
        raise ConfigError(f"--factory {spec}: calling it raised {type(exc).__name__}: {one_line(exc)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--factory {spec}: returned a {type(model).__name__}, not a torch.nn.Module")
    state = strip_wrapper_prefix(state, model.state_dict(), path)
    _check_match(model, state, path, spec)
    model.load_state_dict(state, strict=True)
    model.diagnose_format = "state_dict + factory"
    return model


def factory_arguments(build: Callable, extras: Mapping[str, Any], spec: str, path: Path) -> dict[str, Any]:
    """The keyword arguments a factory gets: each of its parameters that names an entry of the
    checkpoint besides the weights (nanoGPT's model_args, config, iter_num), that entry. A
    factory with no parameters gets none; a required parameter the file does not hold is an error."""
    import inspect

    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called as before, with nothing
        return {}
    P = inspect.Parameter
    kwargs: dict[str, Any] = {}
    for p in params:
        if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD) or p.kind == P.POSITIONAL_ONLY:
            continue
        if p.name in extras:
            kwargs[p.name] = extras[p.name]
        elif p.default is P.empty:
            held = ", ".join(sorted(extras)) or "nothing but the weights"
            raise ConfigError(f"--factory {spec}: its parameter {p.name!r} names no entry of {path} (it holds "
                              f"{held}); give it a default, or name one of those entries (e.g. model_args)")
    return kwargs


_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's OptimizedModule, DistributedDataParallel / DataParallel


def strip_wrapper_prefix(state: dict[str, torch.Tensor], expected: Mapping[str, Any],
                         path: Path) -> dict[str, torch.Tensor]:
    """`state` with a torch.compile / DDP prefix removed from every name, when that makes the names
    the model's own (said in one note); unchanged otherwise."""
    if set(state) == set(expected):
        return state
    names = dict.fromkeys(state)
    stripped: list[str] = []
    for _ in range(len(_PREFIXES) * 2):  # DDP around compile (or the reverse): module._orig_mod.x
        prefix = next((p for p in _PREFIXES if names and all(k.startswith(p) for k in names)), None)
        if prefix is None:
            break
        names = {k: None for k in (n[len(prefix):] for n in names)}
        stripped.append(prefix)
    if not stripped or set(names) != set(expected):
        return state
    cut = len("".join(stripped))
    from ..notes import note

    note(f"{path}: the weights were saved from a wrapped model ({' '.join(repr(p) for p in stripped)} before every "
         "name: torch.compile / DDP); the prefix is stripped and the rest matches the model")
    return {k[cut:]: v for k, v in state.items()}


def _check_match(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path, spec: str) -> None:
    """Name the first missing, unexpected or wrongly shaped tensor (load_state_dict lists them all)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if wrong:
        k = wrong[0]
        problems.append(f"{len(wrong)} of the wrong shape (e.g. {k}: {tuple(state[k].shape)} in the file, "
                        f"{tuple(expected[k].shape)} in the model)")
    if problems:
        raise InputFileError(f"{path}: does not match the model {spec} builds: tensors {'; '.join(problems)}; "
                             "make the factory build the same architecture the weights were saved from")
