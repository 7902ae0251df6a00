"""Image data files: pixel_values [N, C, H, W] (float, as a torchvision/timm transform gives them)
and optional class labels [N], for image models (ViTs: timm, torchvision, Hugging Face).

An `ImageSet` is what `load_data` returns for such a file. It offers what the commands read from a
DataSet (len, inputs, batches, take, labels, source) with `pixel_values` as the main input
(`main_input`), so the same sweep, capture and checks run on it: the batches are
{"pixel_values": x}, which diagnose.calling passes to the model's first parameter (timm's and
torchvision's `forward(x)`) or by name (Hugging Face's `pixel_values`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import DataError
from ._batched import Batched

IGNORE = -100
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class ImageSet(Batched):
    """Images with optional class labels; `batches` yields (inputs, labels) pairs."""

    pixel_values: torch.Tensor  # [N, C, H, W] float
    labels: torch.Tensor | None = None  # [N] int64, -100 = not scored
    source: str = ""
    tokens: None = None  # no token strings: the kept attention maps label patches by position
    attention_mask: None = None
    main_input: str = "pixel_values"

    def __len__(self) -> int:
        return int(self.pixel_values.shape[0])

    @property
    def image_size(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(int(s) for s in self.pixel_values.shape[1:])  # type: ignore[return-value]

    def inputs(self, start: int = 0, stop: int | None = None) -> dict[str, torch.Tensor]:
        """Model inputs for examples [start, stop): {"pixel_values": [n, C, H, W]}."""
        return {"pixel_values": self.pixel_values[start:stop]}

    def take(self, n: int) -> "ImageSet":
        """The first n examples (all of them when n >= len)."""
        cut = slice(0, int(n))
        return replace(self, pixel_values=self.pixel_values[cut],
                       labels=None if self.labels is None else self.labels[cut])


def validate_images(tensors: Mapping[str, Any], path: Path) -> ImageSet:
    """Check pixel_values [N, C, H, W] (finite floats) and labels [N]; the ImageSet or DataError naming the fix."""
    x = tensors["pixel_values"]
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
        what = type(x).__name__ if not isinstance(x, torch.Tensor) else str(x.dtype).replace("torch.", "")
        raise DataError(f"{path}: pixel_values is {what}, but must be a float tensor [N, C, H, W]; store the "
                        "images as the model's transform gives them (e.g. ToTensor() and Normalize)")
    if x.dim() != 4 or 0 in x.shape:
        raise DataError(f"{path}: pixel_values has shape {tuple(x.shape)}, but must be [N, C, H, W] with at least "
                        "one image; add a batch dimension with x.unsqueeze(0) for one image")
    if not bool(torch.isfinite(x).all()):
        raise DataError(f"{path}: pixel_values holds NaN or inf; store finite pixel values")
    if "input_ids" in tensors:
        raise DataError(f"{path}: holds both pixel_values and input_ids; an image data file holds pixel_values "
                        "and labels only")
    labels = tensors.get("labels")
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
            raise DataError(f"{path}: labels must be an integer tensor [N] of class ids")
        labels = labels.to(torch.int64)
        if tuple(labels.shape) != (x.shape[0],):
            raise DataError(f"{path}: labels have shape {tuple(labels.shape)}, but must be [N] = ({x.shape[0]},): "
                            "one class id per image")
        bad = (labels < 0) & (labels != IGNORE)
        if bool(bad.any()):
            raise DataError(f"{path}: labels hold negative values other than {IGNORE} (e.g. {int(labels[bad][0])}); "
                            f"labels lie in [0, n_classes)")
        if not bool((labels != IGNORE).any()):
            raise DataError(f"{path}: every label is {IGNORE}, so nothing can be scored; store the real labels")
    return ImageSet(x.float() if x.dtype != torch.float64 else x, labels, str(path))


def describe_images(data: ImageSet) -> dict[str, Any]:
    """Counts, image shape, pixel range and the labels' layout (what `diagnose info` prints)."""
    x = data.pixel_values
    out: dict[str, Any] = {"source": data.source, "n_examples": len(data), "image_size": list(data.image_size),
                           "pixel_range": [float(x.min()), float(x.max())], "labels": None}
    if data.labels is not None:
        scored = data.labels[data.labels != IGNORE]
        out["labels"] = {"shape": list(data.labels.shape), "kind": "class", "min": int(scored.min()),
                         "max": int(scored.max()), "distinct": int(scored.unique().numel()),
                         "scored_share": float((data.labels != IGNORE).float().mean())}
    return out
