"""Data files: tensors (.pt / .safetensors / .npz) with input_ids [N, T], optional
attention_mask [N, T] and optional labels ([N] or [N, T])."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a data file as a plain dict of tensors (loads with weights_only=True)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp)
    tmp.replace(path)
    return path
