"""The Hugging Face folder guards (no remote code, special files, layer-count sanity) refuse no
real folder: every family of `make families` saved with save_pretrained loads with load_model."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_family_folder_loads(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import families
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from diagnose.io import load_model

    failed = {}
    for i, name in enumerate(families.FAMILIES):
        folder = tmp_path / str(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            families.build(name, "eager").save_pretrained(folder)
        try:
            load_model(folder)
        except Exception as exc:  # collect them all: one run names every family refused
            failed[name] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed
    assert len(families.FAMILIES) >= 30
