"""The task to score a model with when the user does not say."""

from __future__ import annotations

from typing import Any

import torch


def default_task(model: torch.nn.Module, data: Any) -> str:
    """The checkpoint's meta["task"] if saved; else labels [N] -> classification; labels [N, T] or none -> lm."""
    meta = getattr(model, "diagnose_meta", None)
    if isinstance(meta, dict) and meta.get("task") in ("classification", "lm"):
        return meta["task"]
    labels = getattr(data, "labels", None)
    if labels is None and isinstance(data, dict):
        labels = data.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() == 1:
        return "classification"
    return "lm"
