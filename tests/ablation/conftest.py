"""The reference model and data the ablation tests share: a 2-layer causal LM with large enough
weights that every head moves the loss, and padded token ids. A module may state its own sizes
as V, T, N, H, D (vocabulary, tokens, examples, heads, head width); the rest are SIZES."""

from __future__ import annotations

import pytest
import torch

from diagnose.zoo import ModelConfig, Transformer

SIZES = {"V": 20, "T": 7, "N": 10, "H": 4, "D": 8}


def _sizes(request) -> dict[str, int]:
    return {k: getattr(request.module, k, v) for k, v in SIZES.items()}


@pytest.fixture
def model(request):
    s = _sizes(request)
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=s["V"], max_len=16, n_layers=2, n_heads=s["H"],
                                   d_model=s["H"] * s["D"], init_std=0.2)).eval()


@pytest.fixture
def data(request):
    s = _sizes(request)
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(s["N"], s["T"], dtype=torch.long)
    mask[::2, 5:] = 0  # [N, T], padding on every other example
    return {"input_ids": torch.randint(1, s["V"], (s["N"], s["T"]), generator=g) * mask, "attention_mask": mask}
