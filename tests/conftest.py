"""Shared fixtures. Tests run on tiny models; torch is kept to one thread per worker
because two workers x two threads on a 2-core machine thrash (100x slower, measured)."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
