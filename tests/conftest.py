"""Shared fixtures. Tests run on tiny models; torch runs DIAGNOSE_TEST_THREADS threads per worker
(default 1: two workers x two threads thrash a 2-core machine when OpenMP's idle threads spin, 100x
slower, measured; with OMP_WAIT_POLICY=PASSIVE they cost 0.6 to 1.3x one thread, measured). CI's
pass B runs two workers x two threads, passive, so in-process float sums take another path."""

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


def _torch_state() -> dict:
    """Process-wide torch settings a test (or a library it drives) can change and leave behind;
    each changes how later tests' floats round, so a suite's order would change its results."""
    sub = torch.tensor([1e-40]) * torch.tensor([1.0])  # 0 when denormals are flushed (no getter)
    return {
        "threads": torch.get_num_threads(),
        "flush_denormal": bool(sub.item() == 0.0),
        "default_dtype": torch.get_default_dtype(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "grad": torch.is_grad_enabled(),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "mha_fastpath": torch.backends.mha.get_fastpath_enabled(),
        "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
        "math_sdp": torch.backends.cuda.math_sdp_enabled(),
        "mem_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "mkldnn": torch.backends.mkldnn.enabled,
        "anomaly": torch.is_anomaly_enabled(),
    }


def _restore(state: dict) -> None:
    torch.set_num_threads(state["threads"])
    torch.set_flush_denormal(state["flush_denormal"])
    torch.set_default_dtype(state["default_dtype"])
    torch.set_float32_matmul_precision(state["matmul_precision"])
    torch.use_deterministic_algorithms(state["deterministic"])
    torch.set_grad_enabled(state["grad"])
    torch.backends.mha.set_fastpath_enabled(state["mha_fastpath"])
    torch.backends.cuda.enable_flash_sdp(state["flash_sdp"])
    torch.backends.cuda.enable_math_sdp(state["math_sdp"])
    torch.backends.cuda.enable_mem_efficient_sdp(state["mem_sdp"])
    torch.backends.mkldnn.enabled = state["mkldnn"]
    torch.autograd.set_detect_anomaly(state["anomaly"])


@pytest.fixture(autouse=True)
def _no_leaked_torch_state(request):
    """Each test starts from the same torch settings: a leak (a library's Trainer setting threads or
    matmul precision, a test that forgot its finally) would change how every later test in the same
    xdist worker rounds, so a suite could fail where the same test alone passes. Restored and warned."""
    before = _torch_state()
    yield
    after = _torch_state()
    if after != before:
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        _restore(before)
        request.node.warn(pytest.PytestWarning(f"torch settings leaked and were restored: {changed}"))


def pytest_configure(config):
    # xdist's --dist loadfile hands out whole files, by default the files with the most tests first: the
    # few-test multi-second ones (a real model, a 600-step run, a torchrun sweep) came last, and one worker
    # then ran them alone while the other had nothing left. Off, it hands them out in collection order,
    # which pytest_collection_modifyitems below sets.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The files that hold a `slow` test first, each file's tests together and in order: under `make test`'s
    xdist workers the long files start early and the last ones are short, so both cores stay busy to the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: collection order within each group
