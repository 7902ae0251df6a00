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


def test_ci_runs_the_whole_suite_on_every_kernel_path_then_the_matrix_and_the_wheel(tmp_path):
    """Each ATEN_CPU_CAPABILITY path this CPU has gets a whole `make test`, with both thread layouts
    among the passes; then the demo on each path, the version matrix and the wheel."""
    paths = subprocess.run(["bash", str(ROOT / ".ci" / "kernel-paths")], capture_output=True, text=True,
                           check=True).stdout.split()
    assert paths[-1] == "default" and len(set(paths)) == len(paths)
    (tmp_path / ".ci").mkdir()
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    script = (ROOT / ".ci" / "run").read_text().replace("/usr/bin/chromium", str(chromium))
    (tmp_path / ".ci" / "run").write_text(script)
    (tmp_path / ".ci" / "kernel-paths").write_text((ROOT / ".ci" / "kernel-paths").read_text())
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "make.log"
    (stubs / "make").write_text(f'#!/bin/sh\necho "${{ATEN_CPU_CAPABILITY:-native}} ${{DIAGNOSE_TEST_THREADS:--}} $*" >> {log}\n')
    (stubs / "make").chmod(0o755)
    out = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = [line.split(maxsplit=2) for line in log.read_text().splitlines()]
    suites = [(path, threads) for path, threads, args in calls if args.startswith("test")]
    assert {p for p, _ in suites} == set(paths) and len(suites) == max(2, len(paths))  # none native-only
    assert {t for _, t in suites} == {"1", "2"}
    assert [args.split()[0] for _, _, args in calls if not args.startswith("test")] == ["demo-paths", "versions",
                                                                                        "wheel-check"]
