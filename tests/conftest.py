"""Shared fixtures. Tests run on tiny models; torch runs DIAGNOSE_TEST_THREADS threads per worker
(default 1: two workers x two threads on a 2-core machine thrash, 100x slower, measured). CI's
second pass runs one worker with two threads, so in-process float sums take another path."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("DIAGNOSE_TEST_THREADS", "1")))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
