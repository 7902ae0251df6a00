"""`.ci/run` must not go green without the browser: a failed Chromium install stops it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_run_stops_when_chromium_cannot_be_installed(tmp_path):
    script = (ROOT / ".ci" / "run").read_text()
    assert "DIAGNOSE_TEST_THREADS=1 make test" in script
    assert "DIAGNOSE_TEST_THREADS=2 make test TEST_WORKERS=1" in script
    assert "/usr/bin/chromium" in script
    # The same script, in a copy of the tree where chromium is absent and apt-get fails;
    # `make` is a stub that records that the suite was started.
    (tmp_path / ".ci").mkdir()
    run = tmp_path / ".ci" / "run"
    run.write_text(script.replace("/usr/bin/chromium", str(tmp_path / "no-chromium")))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("apt-get", "exit 100"), ("make", f"echo started >> {tmp_path / 'make.log'}")):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(run)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0
    assert "could not install chromium" in out.stderr
    assert not (tmp_path / "make.log").exists()
