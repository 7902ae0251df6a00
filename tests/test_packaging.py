"""The wheel holds one top-level package: cli/ and reports/ live inside diagnose, with the
report's templates and static files, so nothing named `cli` or `reports` reaches site-packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_layout(tmp_path):
    pytest.importorskip("setuptools")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("diagnose-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"diagnose"}
    for needed in ("diagnose/cli/main.py", "diagnose/reports/templates/report.html.j2",
                   "diagnose/reports/static/report.js", "diagnose/py.typed", "diagnose/adapters/_hf_llama.py"):
        assert needed in names, needed
    # every source module ships: a new folder missing from pyproject's packages list would be left out
    sources = {f"diagnose/{p.relative_to(ROOT / 'diagnose').as_posix()}" for p in (ROOT / "diagnose").rglob("*.py")}
    sources |= {f"diagnose/{top}/{p.relative_to(ROOT / top).as_posix()}" for top in ("cli", "reports")
                for p in (ROOT / top).rglob("*.py")}
    assert "diagnose/demo/__init__.py" in sources and "diagnose/demo/_run.py" in sources
    assert sources - set(names) == set()
