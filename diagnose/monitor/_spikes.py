"""Spike forensics: the batch behind a grad_spike / loss_spike / nonfinite alert, saved to the run folder.

    spikes/step_{step:08d}.safetensors  the batch's tensor inputs by name, `labels` if any,
                                        `per_example_loss` if given (never pickle)
    spikes/step_{step:08d}.json         step, kinds, tensors {name: {shape, dtype}}, bytes,
                                        truncated, note (strict JSON)

Each saved step holds at most `cap` bytes of tensor data: when the batch is larger, only its
first rows are kept (every tensor whose first dimension is the batch size is cut alike) and
`truncated` says so. Opt-in: TrainingMonitor(save_spikes=True) and step(batch=...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import _json
from .._write import atomic_write
from ..errors import InputFileError, RunFolderError
from ..io._read import read_json

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
               cap: int) -> dict[str, Any]:
    """Write spikes/step_N.safetensors and its .json; returns the JSON record."""
    from safetensors.torch import save

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
    atomic_write(folder / f"{stem}.json", _json.dumps(record, indent=1) + "\n", keep_on_failure=False,
                 what="spike record")
    return record


def read_spikes(run_dir: str | os.PathLike, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """The spikes/*.json records of a run folder, by step ([] when none were saved). A damaged
    record (not JSON, no integer `step`) is skipped and counted in `skipped`: a side file never
    stops a run from being read."""
    folder = Path(run_dir) / SPIKES
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("step_*.json")):
        try:
            rec = read_json(path, "spike record", "delete it or restore it from the run", limit=16 << 20)
        except InputFileError:
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
            if skipped is not None:
                skipped.append(1)
            continue
        out.append(rec)
    return sorted(out, key=lambda r: r["step"])


def load_spike(run_dir: str | os.PathLike, step: int) -> dict[str, torch.Tensor]:
    """The tensors saved for `step` (safetensors: no code runs on load)."""
    from safetensors.torch import load_file

    path = Path(run_dir) / SPIKES / f"{spike_stem(step)}.safetensors"
    if not path.is_file():
        raise RunFolderError(f"{path} does not exist: no batch was saved at step {step}")
    try:
        return load_file(str(path))
    except Exception as exc:  # a damaged file: safetensors raises its own error types
        raise RunFolderError(f"{path} is not a readable safetensors file ({exc}); delete it") from None
