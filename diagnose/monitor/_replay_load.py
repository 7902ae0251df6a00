"""Loading a saved spike back for its replay: the batch, the previous batch, the model's state into the
user's model object, and the optimizer rebuilt from its saved tensors (safetensors) and JSON; no pickle.

The model's class is never rebuilt from the folder: the caller gives a model object of the run's
architecture (its weights are replaced by the saved ones, strictly: every name and shape must match).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import ConfigError, InputFileError, RunFolderError
from ..io import require_file
from ._spike_state import OPTIMIZERS
from ._spikes import SPIKES, read_spike, spike_stem

MAX_STATE_SLACK = 1 << 20  # bytes a safetensors file may have beyond its tensors (its header)


def spike_record(run_dir: Path, step: int, saved: list[int]) -> dict[str, Any]:
    """The spike record of `step`, strictly read; RunFolderError naming the saved steps when there is none."""
    path = Path(run_dir) / SPIKES / f"{spike_stem(step)}.json"
    if not os.path.lexists(path):
        raise RunFolderError(f"{run_dir}: no spike was saved at step {step} (saved at: "
                             f"{', '.join(map(str, saved)) or 'none'}); TrainingMonitor(save_spikes=True) and "
                             f"step(batch=..., optimizer=...) save one")
    return read_spike(path)


def load_tensors(run_dir: Path, name: str, limit: int) -> dict[str, torch.Tensor]:
    """Every tensor of spikes/<name> (a .safetensors file of at most `limit` bytes), on the CPU."""
    from safetensors.torch import load

    path = Path(run_dir) / SPIKES / name
    fix = "delete the spike's files, or save them again with TrainingMonitor(save_spikes=True)"
    if not os.path.lexists(path):
        raise RunFolderError(f"{path} does not exist; {fix}")
    try:
        require_file(path, "spike file")
    except InputFileError as exc:
        raise RunFolderError(str(exc)) from None
    size = os.stat(path).st_size
    if size > limit:
        raise RunFolderError(f"{path}: is {size:,} bytes, over the {limit:,} its record declares; {fix}")
    try:
        with open(path, "rb") as f:
            return load(f.read())
    except Exception as exc:  # a damaged file: safetensors raises its own error types
        raise RunFolderError(f"{path} is not a readable safetensors file ({type(exc).__name__}); {fix}") from None


def as_batch(tensors: dict[str, torch.Tensor]) -> Any:
    """The batch in the shape step(batch=) was given: a lone tensor, a tuple (names 0, 1, ...) or a dict."""
    tensors = {k: v for k, v in tensors.items() if k != "per_example_loss"}
    if list(tensors) == ["input"]:
        return tensors["input"]
    if tensors and all(k.isdigit() for k in tensors):
        return tuple(tensors[k] for k in sorted(tensors, key=int))
    return tensors


def load_model_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Put the saved `model.*` tensors into `model` (strict); ConfigError naming what does not match."""
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or extra or shapes:
        what = "; ".join(x for x in (f"missing {', '.join(missing[:3])}" if missing else "",
                                     f"unexpected {', '.join(extra[:3])}" if extra else "",
                                     f"other shape: {', '.join(sorted(shapes)[:3])}" if shapes else "") if x)
        raise ConfigError(f"{where}: the model given is not the run's ({what}); give a model of the architecture "
                          f"and size the run trained ({type(model).__name__} has {len(own)} state entries, "
                          f"the saved state {len(state)})")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    model.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True)


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in group.items() if k != "params"}
    if isinstance(out.get("betas"), list):
        out["betas"] = tuple(out["betas"])
    return out


def build_optimizer(model: torch.nn.Module, meta: dict[str, Any] | None, tensors: dict[str, torch.Tensor],
                    factory: Callable[..., Any] | None, where: str) -> Any:
    """The optimizer at the saved step: `factory(param_groups)` or torch.optim.<class> by name, its
    hyperparameters and per-parameter state loaded from the folder. ConfigError when neither can be had."""
    params = dict(model.named_parameters())
    if meta is None:
        if factory is None:
            raise ConfigError(f"{where}: no optimizer state was saved with this spike; pass optimizer_factory "
                              f"(a function of the model's parameter groups) to replay it with a fresh optimizer")
        return factory([{"params": list(params.values())}])
    unknown = [n for g in meta["param_groups"] for n in g["params"] if n not in params]
    if unknown:
        raise ConfigError(f"{where}: the saved optimizer holds parameters the model lacks ({', '.join(unknown[:3])}); "
                          f"give the model the run trained")
    groups = [{"params": [params[n] for n in g["params"]], **_hyper(g)} for g in meta["param_groups"]]
    if factory is not None:
        opt = factory(groups)
    elif meta["class"] in OPTIMIZERS and meta.get("module", "").startswith("torch.optim"):
        cls = getattr(torch.optim, meta["class"])
        known = cls.__init__.__code__.co_varnames
        opt = cls([{"params": g["params"], **{k: v for k, v in g.items() if k != "params" and k in known}}
                   for g in groups])
    else:
        raise ConfigError(f"{where}: the run's optimizer is {meta.get('module')}.{meta['class']}, which diagnose "
                          f"does not rebuild by name (only torch.optim's {', '.join(OPTIMIZERS)}); pass "
                          f"optimizer_factory=lambda groups: YourOptimizer(groups)")
    index = {n: i for i, n in enumerate(n for g in meta["param_groups"] for n in g["params"])}
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        if key.startswith("optimizer."):
            name, _, field = key[len("optimizer."):].rpartition(".")
            if name in index:
                state.setdefault(index[name], {})[field] = t.to(params[name].device)
    for name, values in (meta.get("scalars") or {}).items():
        if name in index:
            state.setdefault(index[name], {}).update(values)
    own = opt.state_dict()["param_groups"]  # keys the saved JSON lacks keep the rebuilt optimizer's value
    saved_groups = [{**o, **_hyper(g), "params": [index[n] for n in g["params"]]}
                    for o, g in zip(own, meta["param_groups"])]
    opt.load_state_dict({"state": state, "param_groups": saved_groups})
    return opt
