"""What a spike replay needs besides the batch: the model and optimizer state and an earlier batch.

Saved beside the batch (_spikes.py) when a spike alert fires, inside the same `spike_bytes`:

    spikes/step_{step:08d}.state.safetensors     `model.<name>` for every entry of model.state_dict()
                                                 (parameters and buffers as the step's forward saw them:
                                                 step() runs before optimizer.step()), and
                                                 `optimizer.<param name>.<key>` for every tensor of the
                                                 optimizer's per-parameter state (Adam's exp_avg, ...)
    spikes/step_{step:08d}.previous.safetensors  the batch of the logged step before, by name: a
                                                 held-out batch to measure an update's harm on

and in the step's JSON record: `state` {file, bytes, optimizer: {class, param_groups [{params: [names],
lr, betas, ...}], scalars {param: {key: number}}} or null}, `previous` {step, file, tensors, bytes},
and `state_note` when something was not saved (and why). Tensors in safetensors, the rest strict JSON:
nothing is unpickled and no code is named in the folder; the optimizer is rebuilt from torch.optim's
own classes by name (SGD, Adam, AdamW) or by a factory the user passes to the replay.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import torch

from .._write import atomic_write
from ..errors import ConfigError, RunFolderError
from ._spikes import SPIKES, batch_tensors, spike_stem

OPTIMIZERS = ("SGD", "Adam", "AdamW")  # rebuilt by name from torch.optim; any other needs a factory
_FIX = "the file was not written by diagnose.TrainingMonitor, or was edited: restore it or delete it"


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _plain(value: Any) -> Any:
    """A hyperparameter as strict JSON (a tuple as a list, a 0-d tensor as its number), or None
    when it has no JSON form (a callable, a device)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if value is None or isinstance(value, (bool, str)) or isinstance(value, numbers.Real):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Real) for v in value):
        return [float(v) for v in value]
    return None


def optimizer_state(model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(the optimizer's JSON part, its tensors by `optimizer.<param name>.<key>`); a parameter the model
    does not own raises ConfigError (which save_state writes into the record's state_note)."""
    from ._probes_optim import _torch_optimizer

    optimizer = _torch_optimizer(optimizer) or optimizer  # a trainer's wrapper: the torch optimizer inside
    names = {id(p): n for n, p in model.named_parameters()}
    sd = optimizer.state_dict()
    groups, tensors, scalars = [], {}, {}
    for group, saved in zip(optimizer.param_groups, sd["param_groups"]):
        pnames = []
        for p, idx in zip(group["params"], saved["params"]):
            if id(p) not in names:
                raise ConfigError("the optimizer holds a parameter that is not the model's")
            pnames.append(names[id(p)])
            for key, value in sd["state"].get(idx, {}).items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer.{names[id(p)]}.{key}"] = value.detach()
                elif _plain(value) is not None:
                    scalars.setdefault(names[id(p)], {})[key] = _plain(value)
        hyper = {k: _plain(v) for k, v in saved.items() if k != "params" and _plain(v) is not None}
        groups.append({"params": pnames, **hyper})
    meta = {"class": type(optimizer).__name__, "module": type(optimizer).__module__,
            "param_groups": groups, "scalars": scalars}
    return meta, tensors


def save_state(run_dir: Path, step: int, model: torch.nn.Module | None, optimizer: Any, left: int,
               previous: tuple[int, Any] | None) -> dict[str, Any]:
    """Write the state and the previous batch when they fit in `left` bytes; returns the record's
    `state`, `previous` and `state_note` fields."""
    from safetensors.torch import save

    folder, stem, notes = Path(run_dir) / SPIKES, spike_stem(step), []
    out: dict[str, Any] = {"state": None, "previous": None}
    if model is None:
        notes.append("no model to save")
    else:
        tensors = {f"model.{k}": v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        meta = None
        if optimizer is None:
            notes.append("no optimizer given to step(optimizer=...): the replay needs optimizer_factory")
        else:
            try:
                meta, opt_tensors = optimizer_state(model, optimizer)
                tensors.update(opt_tensors)
            except ConfigError as exc:
                notes.append(f"optimizer state not saved: {exc}")
        size = _nbytes(tensors)
        if any(type(t) is not torch.Tensor for t in tensors.values()):
            notes.append("model and optimizer state not saved: sharded (DTensor) parameters")
        elif size > left:
            notes.append(f"model and optimizer state not saved: {size:,} bytes, over the {max(left, 0):,} "
                         "left of spike_bytes after the batch; raise TrainingMonitor(spike_bytes=...) to replay")
        else:
            tensors = {k: v.to("cpu").contiguous().clone() for k, v in tensors.items()}
            atomic_write(folder / f"{stem}.state.safetensors", save(tensors), keep_on_failure=False,
                         what="spike state")
            out["state"] = {"file": f"{stem}.state.safetensors", "bytes": size, "optimizer": meta}
            left -= size
    if previous is not None:
        prev = {k: v.detach().to("cpu").contiguous().clone() for k, v in batch_tensors(previous[1]).items()}
        if prev and _nbytes(prev) <= left:
            atomic_write(folder / f"{stem}.previous.safetensors", save(prev), keep_on_failure=False,
                         what="spike previous batch")
            out["previous"] = {"step": int(previous[0]), "file": f"{stem}.previous.safetensors",
                               "bytes": _nbytes(prev), "tensors": {k: {"shape": list(v.shape),
                                                                       "dtype": str(v.dtype).replace("torch.", "")}
                                                                   for k, v in prev.items()}}
        elif prev:
            notes.append(f"previous batch not saved: {_nbytes(prev):,} bytes, over the {max(left, 0):,} left")
    if notes:
        out["state_note"] = "; ".join(notes)
    return out


def check_state(rec: dict[str, Any], where: str) -> None:
    """Raise RunFolderError unless the replay fields of a spike record (absent in older folders) have their types."""
    state, previous, note = rec.get("state"), rec.get("previous"), rec.get("state_note")
    for name, value in (("state", state), ("previous", previous)):
        if value is not None and not (isinstance(value, dict) and isinstance(value.get("file"), str)
                                      and "/" not in value["file"] and value["file"].endswith(".safetensors")):
            raise RunFolderError(f"{where}: `{name}` is not an object naming a .safetensors file of spikes/; {_FIX}")
    opt = (state or {}).get("optimizer")
    if opt is not None and not (isinstance(opt, dict) and isinstance(opt.get("class"), str)
                                and isinstance(opt.get("param_groups"), list)
                                and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                        and all(isinstance(n, str) for n in g["params"]) for g in opt["param_groups"])
                                and isinstance(opt.get("scalars", {}), dict)):
        raise RunFolderError(f"{where}: `state.optimizer` is not {{class, param_groups [{{params: [names]}}]}}; {_FIX}")
    if previous is not None and not (isinstance(previous.get("step"), int) and not isinstance(previous["step"], bool)):
        raise RunFolderError(f"{where}: `previous.step` is not an integer; {_FIX}")
    if note is not None and not isinstance(note, str):
        raise RunFolderError(f"{where}: `state_note` is not text; {_FIX}")
