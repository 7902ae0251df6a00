"""Whatever the user passes as `data`, as a re-iterable sequence of (inputs, labels) batches.

The batches stay where the data is (usually the CPU) and each one moves to the model's device
only when it is read: a data set larger than the accelerator's memory still sweeps.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from ..errors import DataError
from ..objectives import batch_size_of

DEFAULT_BATCH = 32


def as_batches(data: Any, batch_size: int | None, device: torch.device | None = None) -> "Batches":
    """(inputs, labels) pairs from a DataSet/TaskData (anything with input_ids), a dict of
    tensors, or an iterable of pairs (used as given; batch_size then only applies to the others).
    Each pair moves to `device` when it is read, one at a time."""
    bs = int(batch_size or DEFAULT_BATCH)
    if bs < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    if isinstance(data, Batches):  # already cut: keep the pairs where they are
        return Batches(data.pairs, device, data.last_position)
    if isinstance(data, Mapping) and ("input_ids" in data or "pixel_values" in data):
        pairs = _chunks(dict(data), data.get("labels"), bs)
    elif isinstance(getattr(data, "pixel_values", None), torch.Tensor):  # an ImageSet (diagnose.io)
        pairs = _chunks({"pixel_values": data.pixel_values}, getattr(data, "labels", None), bs)
    elif hasattr(data, "input_ids") and isinstance(getattr(data, "input_ids"), torch.Tensor):
        fields = {"input_ids": data.input_ids}
        for name in ("attention_mask", "token_type_ids"):
            if isinstance(getattr(data, name, None), torch.Tensor):
                fields[name] = getattr(data, name)
        pairs = _chunks(fields, getattr(data, "labels", None), bs)
    elif isinstance(data, Iterable):
        pairs = [_pair(item) for item in data]
    else:
        raise DataError(f"cannot read examples from a {type(data).__name__}; pass a DataSet, a dict with "
                        "input_ids, or an iterable of (inputs, labels) pairs")
    pairs = [(x, y) for x, y in pairs if batch_size_of(x) > 0]  # an empty batch has nothing to score
    if not pairs:
        raise DataError("the data holds no examples")
    return Batches(pairs, device)


def for_last_position(model: torch.nn.Module, batches: "Batches", task: str) -> "Batches":
    """`batches` as `model` can be scored on them. A language model that returns the last position
    only (nanoGPT without targets: [B, 1, V], see diagnose.calling) is scored there, on the token
    after each example's last input: its batches lose their last position, which becomes the label
    [B, 1]; the user is told once. Any other model (or task) gets `batches` unchanged.
    One forward of one example decides."""
    from ..calling import last_position_batch, last_position_only, logits, note_last_position
    from ..modes import eval_mode

    if task != "lm" or not len(batches) or batches.last_position:  # cut once: a cut batch is last-position too
        return batches
    x, _ = batches[0]
    one = {k: v[:1] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in x.items()} \
        if isinstance(x, Mapping) else x[:1]
    from ..objectives import call_model

    with eval_mode(model), torch.no_grad():
        out = logits(call_model(model, one))
    if not last_position_only(out, one):
        return batches
    note_last_position(model)
    return Batches([last_position_batch(x, y) for x, y in batches.pairs], batches.device, last_position=True)


class Batches(Sequence):
    """A re-iterable list of (inputs, labels) pairs that are moved to `device` one at a time, as read."""

    def __init__(self, pairs: list[tuple[Any, Any]], device: torch.device | None = None, last_position: bool = False):
        self.pairs, self.device = list(pairs), device
        self.last_position = last_position  # cut by for_last_position: scored on the token after the last input

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Batches(self.pairs[i], self.device, self.last_position)
        x, y = self.pairs[i]
        return _to(x, self.device), _to(y, self.device)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return (self[i] for i in range(len(self)))


def wrong_labels(data: Any) -> torch.Tensor | None:
    """The data set's wrong answers (`wrong_labels`, shaped like its labels, -100 where none is named), read
    by each batch's example indices; None for data without them (or given as ready-made batches)."""
    found = data.get("wrong_labels") if isinstance(data, Mapping) else getattr(data, "wrong_labels", None)
    if found is None:
        return None
    labels = data.get("labels") if isinstance(data, Mapping) else getattr(data, "labels", None)
    if not isinstance(found, torch.Tensor) or not isinstance(labels, torch.Tensor) or found.shape != labels.shape:
        what = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        raise DataError(f"wrong_labels {what} must be a tensor shaped like labels "
                        f"{tuple(labels.shape) if isinstance(labels, torch.Tensor) else None}")
    return found.long().cpu()


def padding_mask(inputs: Any) -> torch.Tensor | None:
    """attention_mask [B, T] (1 = real token) when the inputs carry one."""
    if isinstance(inputs, Mapping) and isinstance(inputs.get("attention_mask"), torch.Tensor):
        mask = inputs["attention_mask"]
        return mask if mask.dim() == 2 else None
    return None


def _chunks(fields: dict[str, Any], labels: Any, bs: int) -> list[tuple[Any, Any]]:
    inputs = {k: v for k, v in fields.items() if k not in ("labels", "wrong_labels") and isinstance(v, torch.Tensor)}
    n = int(inputs["input_ids" if "input_ids" in inputs else "pixel_values"].shape[0])
    return [({k: v[i:i + bs] for k, v in inputs.items()}, None if labels is None else labels[i:i + bs])
            for i in range(0, n, bs)]


def _pair(item: Any) -> tuple[Any, Any]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise DataError(f"each batch must be an (inputs, labels) pair, got a {type(item).__name__}")


def _to(obj: Any, device: torch.device | None) -> Any:
    if device is None or obj is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj
