"""Shared helpers of tests/clients: small models written after the model code people write and train
themselves (issue 31), for tests that must not use the network or copy those projects' code:

    nanogpt          karpathy/nanoGPT model.py        GPT(GPTConfig); forward(idx, targets=None) -> (logits, loss)
    mingpt           karpathy/minGPT mingpt/model.py  GPT(config); forward(idx, targets=None) -> (logits, loss)
    xtransformers    lucidrains/x-transformers        TransformerWrapper(Decoder(...)); forward(x, mask=None)
    timm_vit         timm VisionTransformer           forward(x, attn_mask=None, is_causal=False) -> [N, classes]
    torchvision_vit  torchvision VisionTransformer    forward(x) -> [N, classes]

Each module is our own code with the original's module names, nesting, forward signature, return
convention and checkpoint format, and a `make(seed=0, **overrides)` factory for a tiny config.
(No __init__.py: a package there would cut it off from tests/ under pytest's importlib mode; import
them as `from ..clients import nanogpt` and `from ..clients.files import pixel_values`.) The helpers
here are what users of the last three hold: `torch.save(model.state_dict(), path)` and float images
[N, 3, H, W] (`pixel_values`)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["save_state_dict", "pixel_values", "save_images"]


def save_state_dict(model: torch.nn.Module, path: str | Path) -> Path:
    """The checkpoint most users of minGPT, x-transformers, timm and torchvision write by hand."""
    torch.save(model.state_dict(), path)
    return Path(path)


def pixel_values(n: int = 4, *, size: int = 16, seed: int = 0) -> torch.Tensor:
    """Images as a torchvision/timm transform hands them to the model: float32 [n, 3, size, size],
    normalised with ImageNet's mean and std (so roughly zero mean, unit spread)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n, 3, size, size, generator=g)  # [n, 3, H, W] in [0, 1], as ToTensor() gives
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (raw - mean) / std


def save_images(path: str | Path, images: torch.Tensor, labels: torch.Tensor | None = None) -> Path:
    """A data file of images as an image-model user holds one: {'pixel_values': [N, 3, H, W] float,
    'labels': [N] int64 (optional)}, written with torch.save."""
    data = {"pixel_values": images}
    if labels is not None:
        data["labels"] = labels
    torch.save(data, path)
    return Path(path)
