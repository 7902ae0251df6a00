"""`make families` (bench/families.py) builds its table from tiny random models: two rows here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_families_table_rows():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "families.py"), "--only", "GPT-2,ALBERT"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| GPT-2") or line.startswith("| ALBERT")]
    assert len(rows) == 4, out
    assert "| GPT-2 | sdpa | ok | ok (2 sites) | ok (4 passed, 0 skipped) |" in rows
    assert any("ALBERT | eager | ok | ok (2 sites, shared)" in r for r in rows)
