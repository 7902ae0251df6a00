"""Spike forensics: the batch behind a grad_spike / loss_spike / nonfinite alert, saved to the run folder.

    spikes/step_{step:08d}.safetensors  the batch's tensor inputs by name, `labels` if any,
                                        `per_example_loss` if given (never pickle)
    spikes/step_{step:08d}.json         step, kinds, tensors {name: {shape, dtype}}, bytes,
                                        truncated, note (strict JSON); and for a replay: state,
                                        previous, state_note (_spike_state.py; absent in older folders)

Each saved step holds at most `cap` bytes of tensor data: when the batch is larger, only its
first rows are kept (every tensor whose first dimension is the batch size is cut alike) and
`truncated` says so. Opt-in: TrainingMonitor(save_spikes=True) and step(batch=...).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import _json
from .._numbers import kind
from .._write import atomic_write
from ..errors import InputFileError, RunFolderError
from ..io import read_json, require_file

SPIKES = "spikes"
SPIKE_KINDS = ("grad_spike", "loss_spike", "nonfinite")


def spike_stem(step: int) -> str:
    return f"step_{int(step):08d}"


def batch_tensors(batch: Any) -> dict[str, torch.Tensor]:
    """The tensors of a batch by name: a dict (or BatchEncoding-like mapping) keeps its keys, a
    tuple/list is numbered, a lone tensor is `input`; nested dicts join names with '.'."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            out[prefix or "input"] = obj
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, (tuple, list)):
            for i, v in enumerate(obj):
                walk(f"{prefix}.{i}" if prefix else str(i), v)

    walk("", batch)
    return out


def join_micro_batches(batches: list[Any]) -> Any:
    """One batch from a step's micro-batches: each tensor concatenated along the batch dimension when
    every micro-batch has the same names and trailing shapes, else `micro_batch_{i}.<name>`."""
    if len(batches) == 1:
        return batches[0]
    parts = [batch_tensors(b) for b in batches]
    names = list(parts[0])
    if names and all(list(p) == names for p in parts) and all(
            p[n].dim() >= 1 and p[n].shape[1:] == parts[0][n].shape[1:] for p in parts for n in names):
        return {n: torch.cat([p[n] for p in parts]) for n in names}
    return {f"micro_batch_{i}": b for i, b in enumerate(parts)}


def _rows(tensors: dict[str, torch.Tensor]) -> int | None:
    """The batch size: the first dimension most tensors share (None when no tensor has one)."""
    firsts = [t.shape[0] for t in tensors.values() if t.dim() >= 1]
    return max(set(firsts), key=firsts.count) if firsts else None


def _cut(tensors: dict[str, torch.Tensor], cap: int) -> tuple[dict[str, torch.Tensor], bool, str]:
    """Keep at most `cap` bytes: whole when it fits, else the first k rows of the batched tensors."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total <= cap:
        return tensors, False, ""
    rows = _rows(tensors)
    batched = {k: t for k, t in tensors.items() if rows is not None and t.dim() >= 1 and t.shape[0] == rows}
    fixed = {k: t for k, t in tensors.items() if k not in batched}
    fixed_bytes = sum(t.numel() * t.element_size() for t in fixed.values())
    notes = []
    if fixed_bytes > cap:
        notes.append(f"dropped {', '.join(sorted(fixed))} (not batched, {fixed_bytes} bytes over the cap)")
        fixed, fixed_bytes = {}, 0
    per_row = sum(t[0].numel() * t.element_size() for t in batched.values()) if batched else 0
    keep = min(rows or 0, (cap - fixed_bytes) // per_row) if per_row else 0
    kept = {k: t[:keep] for k, t in batched.items()} if keep else {}
    if batched:
        notes.append(f"kept the first {keep} of {rows} examples to stay under {cap} bytes")
    return {**fixed, **kept}, True, "; ".join(notes)


def save_spike(run_dir: Path, step: int, kinds: list[str], batch: Any, per_example_loss: Any,
               cap: int, *, model: Any = None, optimizer: Any = None, previous: Any = None) -> dict[str, Any]:
    """Write spikes/step_N.safetensors and its .json; returns the JSON record. With `model` (and
    `optimizer`, `previous` = (step, batch) of the logged step before) also what a replay needs,
    in what is left of `cap` (_spike_state.py)."""
    from safetensors.torch import save

    from ._spike_state import save_state

    tensors = {k: v.detach() for k, v in batch_tensors(batch).items()}
    if isinstance(per_example_loss, torch.Tensor):
        tensors["per_example_loss"] = per_example_loss.detach().float()
    tensors, truncated, note = _cut(tensors, cap)
    # to the host, contiguous, and owning its memory (safetensors refuses shared storage)
    tensors = {k: v.to("cpu").contiguous().clone() for k, v in tensors.items()}
    if per_example_loss is None:
        note = "; ".join(x for x in (note, "no per-example loss given") if x)
    folder = Path(run_dir) / SPIKES
    stem = spike_stem(step)
    atomic_write(folder / f"{stem}.safetensors", save(tensors), keep_on_failure=False, what="spike batch")
    record = {"step": int(step), "kinds": list(kinds),
              "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                          for k, v in tensors.items()},
              "bytes": int(sum(v.numel() * v.element_size() for v in tensors.values())),
              "truncated": truncated, "note": note}
    if model is not None:
        record.update(save_state(run_dir, step, model, optimizer, cap - record["bytes"], previous))
    atomic_write(folder / f"{stem}.json", _json.dumps(record, indent=1) + "\n", keep_on_failure=False,
                 what="spike record")
    return record


MAX_SPIKE_FILE = 256 << 20  # bytes of one saved batch a reader loads (the monitor's default cap is 16 MB)
_FIX = "the file was not written by diagnose.TrainingMonitor, or was edited: restore it or delete it"


def check_spike(rec: Any, where: str) -> None:
    """Raise RunFolderError unless a spike record's fields have the types the readers use."""
    if not isinstance(rec, dict):
        raise RunFolderError(f"{where}: holds {kind(rec)}, not an object; {_FIX}")
    step, kinds, tensors = rec.get("step"), rec.get("kinds", []), rec.get("tensors", {})
    if not isinstance(step, int) or isinstance(step, bool):
        raise RunFolderError(f"{where}: `step` is {kind(step)}, not an integer; {_FIX}")
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise RunFolderError(f"{where}: `kinds` is {kind(kinds)}, not a list of alert kinds; {_FIX}")
    if not isinstance(tensors, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("shape"), list) and all(
                isinstance(d, int) and not isinstance(d, bool) for d in t["shape"])
            and isinstance(t.get("dtype"), str) for t in tensors.values()):
        raise RunFolderError(f"{where}: `tensors` is not an object of {{shape: [sizes], dtype: name}}; {_FIX}")
    for key, want, name in (("bytes", int, "an integer"), ("truncated", bool, "true/false"), ("note", str, "text")):
        value = rec.get(key)
        if value is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            raise RunFolderError(f"{where}: `{key}` is {kind(value)}, not {name}; {_FIX}")
    from ._spike_state import check_state

    check_state(rec, where)


def read_spike(path: Path) -> dict[str, Any]:
    """One spikes/step_N.json record, checked (RunFolderError naming the file and field)."""
    try:
        rec = read_json(path, "spike record", "delete it or restore it from the run", limit=16 << 20)
    except InputFileError as exc:
        raise RunFolderError(str(exc)) from None
    check_spike(rec, str(path))
    return rec


def read_spikes(run_dir: str | os.PathLike, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """The spikes/*.json records of a run folder, by step ([] when none were saved). A damaged
    record (not JSON, a field of the wrong type) is skipped and counted in `skipped`: a side file
    never stops a run from being read (`stats --step N` reads that step's record strictly)."""
    folder = Path(run_dir) / SPIKES
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("step_*.json"))[:100_000]:
        try:
            out.append(read_spike(path))
        except RunFolderError:
            if skipped is not None:
                skipped.append(1)
    return sorted(out, key=lambda r: r["step"])


def top_examples(run_dir: str | os.PathLike, step: int, top: int) -> list[dict[str, Any]]:
    """The `top` examples of the batch saved at `step` with the highest per-example loss (NaN last,
    ties in example order), each with its first 32 token ids when the batch has them [N, T].

    Only what is shown is loaded: the loss vector whole (at most MAX_SPIKE_FILE bytes of file) and
    `top` rows of the ids. Sorting is done on the tensor, not element by element in Python."""
    from safetensors import safe_open

    path = Path(run_dir) / SPIKES / f"{spike_stem(step)}.safetensors"
    fix = "delete it, or save the batch again with TrainingMonitor(save_spikes=True)"
    if not os.path.lexists(path):
        raise RunFolderError(f"{path} does not exist: no batch was saved at step {step}")
    try:
        require_file(path, "spike batch")  # /dev/zero or a FIFO behind the name: said so, never opened
    except InputFileError as exc:
        raise RunFolderError(str(exc)) from None
    size = os.stat(path).st_size
    if size > MAX_SPIKE_FILE:
        raise RunFolderError(f"{path}: is {size:,} bytes, over the {MAX_SPIKE_FILE:,} a saved batch may have; save "
                             "smaller spike batches (TrainingMonitor(spike_bytes=...)) or delete it")
    try:
        with safe_open(str(path), "pt") as f:
            names = list(f.keys())
            if "per_example_loss" not in names:
                return []
            loss = f.get_tensor("per_example_loss")
            if loss.is_complex() or not loss.is_floating_point() or loss.dim() != 1:
                raise RunFolderError(f"{path}: `per_example_loss` is {loss.dtype} {list(loss.shape)}, not one real "
                                     f"number per example; {fix}")
            order = _highest(loss, top)
            ids_name = _ids_name({n: f.get_slice(n) for n in names}, len(loss))
            rows = {i: f.get_slice(ids_name)[i:i + 1, :32][0].tolist() for i in order} if ids_name else {}
    except RunFolderError:
        raise
    except Exception as exc:  # a damaged file: safetensors raises its own error types
        raise RunFolderError(f"{path} is not a readable safetensors file ({type(exc).__name__}); {fix}") from None
    return [{"index": i, "loss": float(loss[i]), **({"input_ids": rows[i]} if i in rows else {})} for i in order]


def _highest(loss: torch.Tensor, k: int) -> list[int]:
    """Indices of the k largest values of loss [N], NaN counted lowest, ties by index."""
    key = loss.float().nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)  # [N]
    k = min(k, key.numel())
    if k == 0:
        return []
    cut = float(torch.topk(key, k).values.min())
    above = torch.nonzero(key > cut).flatten().tolist()
    tied = torch.nonzero(key == cut).flatten()[:k - len(above)].tolist()
    return sorted(above + tied, key=lambda i: (-float(key[i]), i))


def _ids_name(slices: dict[str, Any], n: int) -> str | None:
    """The tensor [N, T] that holds the examples' token ids: `input_ids` (or `*.input_ids`), else the first
    integer one of that shape; None when there is none (a 1-D `input_ids` is shown without ids)."""
    def fits(name: str) -> bool:
        shape, dtype = slices[name].get_shape(), slices[name].get_dtype()
        return len(shape) == 2 and shape[0] == n and dtype.startswith(("I", "U"))
    named = [k for k in slices if (k == "input_ids" or k.endswith(".input_ids")) and fits(k)]
    others = [k for k in slices if k != "labels" and k != "per_example_loss" and fits(k)]
    return (named + others or [None])[0]
