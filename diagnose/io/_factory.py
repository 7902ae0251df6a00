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


def resolve_factory(spec: str) -> Callable[[], Any]:
    """Import `module:function` (module may be dotted or a path to a .py file; cwd is searched)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--factory {spec!r}: expected module:function, e.g. mymodels:build_model")
    with cwd_on_path():
        try:
            module = _import(module_name)
        except ConfigError:
            raise
        except Exception as exc:  # the module's own import-time code can raise anything
            raise ConfigError(f"--factory {spec}: cannot import {module_name} ({type(exc).__name__}: "
                              f"{one_line(exc)}); run diagnose from the folder that holds it") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--factory {spec}: {module_name} has no {attr!r}; name a function that "
                              "builds the model and takes no arguments")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"--factory {spec}: {attr} is not callable; name a function that builds the model")
    return target


def _import(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"--factory: {path} does not exist")
        spec = importlib.util.spec_from_file_location(f"_diagnose_factory_{path.stem}", path)
        assert spec is not None and spec.loader is not None, f"no import spec for {path}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def read_state_dict(path: Path, *, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} from .safetensors or a torch.save file (weights_only=True unless trusted)."""
    require_file(path, "state_dict file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputFileError(f"{path}: not a readable safetensors file ({one_line(exc)}); "
                                 "write it with safetensors.torch.save_file(model.state_dict(), path)") from None
    obj = torch_load(path, what="state_dict file", trust_pickle=trust_pickle)
    from ._checkpoint import is_checkpoint
    if is_checkpoint(obj):
        obj = obj["state_dict"]
    elif isinstance(obj, Mapping) and not _is_tensor_dict(obj):
        inner = next((obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
        obj = inner if inner is not None else obj
    if not isinstance(obj, Mapping) or not _is_tensor_dict(obj):
        raise InputFileError(f"{path}: holds a {type(obj).__name__}, not a state_dict of tensors; "
                             "save it with torch.save(model.state_dict(), path)")
    return dict(obj)


def _is_tensor_dict(obj: Mapping) -> bool:
    return bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def model_from_factory(spec: str, path: Path, *, trust_pickle: bool = False) -> nn.Module:
    """Build the model with the factory, then load the file's state_dict strictly."""
    require_file(path, "state_dict file for --factory")
    build = resolve_factory(spec)
    try:
        model = build()
    except Exception as exc:  # user code
        raise ConfigError(f"--factory {spec}: calling it raised {type(exc).__name__}: {one_line(exc)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--factory {spec}: returned a {type(model).__name__}, not a torch.nn.Module")
    state = read_state_dict(path, trust_pickle=trust_pickle)
    _check_match(model, state, path, spec)
    model.load_state_dict(state, strict=True)
    model.diagnose_format = "state_dict + factory"
    return model


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
