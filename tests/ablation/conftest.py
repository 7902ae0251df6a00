"""The reference model and data the engine and plan tests share: a 2-layer causal LM with large
enough weights that every head moves the loss, and padded token ids. Each module states its sizes
as V, T, N, H, D (vocabulary, tokens, examples, heads, head width) and gets them here."""

from __future__ import annotations

import pytest
import torch

from diagnose.zoo import ModelConfig, Transformer


@pytest.fixture
def model(request):
    m = request.module
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=m.V, max_len=16, n_layers=2, n_heads=m.H, d_model=m.H * m.D,
                                   init_std=0.2)).eval()


@pytest.fixture
def data(request):
    m = request.module
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(m.N, m.T, dtype=torch.long)
    mask[::2, 5:] = 0  # [N, T], padding on every other example
    return {"input_ids": torch.randint(1, m.V, (m.N, m.T), generator=g) * mask, "attention_mask": mask}
