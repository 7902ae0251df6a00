"""The wheel holds one top-level package: cli/ and reports/ live inside diagnose, with the
report's templates and static files and the demo's shipped models, so nothing named `cli` or
`reports` reaches site-packages. (`make wheel-check` installs the wheel in a clean venv and runs it.)"""

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
    (wheel,) = tmp_path.glob("diagnose_transformers-*.whl")  # `diagnose` on the index is another project
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"diagnose"}
    for needed in ("diagnose/cli/main.py", "diagnose/reports/templates/report.html.j2",
                   "diagnose/reports/static/report.js", "diagnose/py.typed", "diagnose/adapters/_hf_llama.py",
                   "diagnose/demo/models/manifest.json"):
        assert needed in names, needed
    # every source module ships: a new folder missing from pyproject's packages list would be left out
    sources = {f"diagnose/{p.relative_to(ROOT / 'diagnose').as_posix()}" for p in (ROOT / "diagnose").rglob("*.py")}
    sources |= {f"diagnose/{top}/{p.relative_to(ROOT / top).as_posix()}" for top in ("cli", "reports")
                for p in (ROOT / top).rglob("*.py")}
    assert "diagnose/demo/__init__.py" in sources and "diagnose/demo/_run.py" in sources
    assert sources - set(names) == set()
    # ... and so does every file of the demo's shipped models (weights, recorded runs)
    shipped = {f"diagnose/demo/models/{p.relative_to(ROOT / 'diagnose/demo/models').as_posix()}"
               for p in (ROOT / "diagnose/demo/models").rglob("*") if p.is_file()}
    assert len(shipped) >= 10 and shipped - set(names) == set()
    # ... and every template and static file of the report (the lessons' section too, which the wheel
    # check's `diagnose demo --quick --no-lessons` does not render)
    assets = {f"diagnose/reports/{p.relative_to(ROOT / 'reports').as_posix()}" for sub in ("templates", "static")
              for p in (ROOT / "reports" / sub).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert "diagnose/reports/templates/_lessons.html.j2" in assets and assets - set(names) == set()
