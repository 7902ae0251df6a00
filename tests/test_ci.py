"""`.ci/run` must not go green without the browser: a failed Chromium install stops it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_run_stops_when_chromium_cannot_be_installed(tmp_path):
    script = (ROOT / ".ci" / "run").read_text()
    assert "DIAGNOSE_TEST_THREADS=1 make test" in script
    assert "DIAGNOSE_TEST_THREADS=2 make test-numerics TEST_WORKERS=1" in script
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


def test_ci_runs_the_whole_suite_once_and_the_numerics_tests_on_every_other_path_then_the_matrix(tmp_path):
    """The whole `make test` once, on the native (widest) path; `make test-numerics` on every other
    ATEN_CPU_CAPABILITY path this CPU has, with both thread layouts among the passes; first the
    conflict-marker check, then the demo on each path, the version matrix and the wheel."""
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
    whole = [(path, threads) for path, threads, args in calls if args.split()[0] == "test"]
    numerics = [(path, threads) for path, threads, args in calls if args.split()[0] == "test-numerics"]
    assert whole == [(paths[0], "1")]  # the whole suite once, on the native path
    assert {p for p, _ in numerics} == set(paths[1:] or paths) and len(numerics) == max(1, len(paths) - 1)
    assert {t for _, t in whole + numerics} == {"1", "2"}
    assert [args.split()[0] for _, _, args in calls if not args.startswith("test")] == [
        "conflicts", "demo-paths", "versions", "wheel-check"]


def test_the_numerics_target_and_both_version_rows_select_the_marker():
    makefile = (ROOT / "Makefile").read_text()
    out = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "test-numerics", "test", "STAMP=pyproject.toml"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert [line.split(" -m pytest ")[1] for line in out if " -m pytest " in line] == ["-q -rs -n 2 --dist loadfile -m numerics ",
                                                              "-q -rs -n 2 --dist loadfile "]
    assert "VERSIONS_TEST ?= test-numerics" in makefile and makefile.count("$(MAKE) $(VERSIONS_TEST) VENV=") == 2


def _conflict_markers():
    """.ci/conflict_markers.py, the script CI runs, imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("conflict_markers", ROOT / ".ci" / "conflict_markers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_conflict_is_found_and_a_markdown_underline_is_not(tmp_path):
    cm = _conflict_markers()
    lt, eq, gt = "<" * 7, "=" * 7, ">" * 7
    text = f"Title\n{eq}\n| a |\n{lt} HEAD\n| b |\n{eq}\n| c |\n{gt} topic\n{eq}\n"
    assert cm.markers(text) == [(4, f"{lt} HEAD"), (6, eq), (8, f"{gt} topic")]
    # in a git checkout: the tracked text file is named with its line, an untracked or binary one is not
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "table.md").write_text(text)
    (tmp_path / "blob.bin").write_bytes(b"\0" + f"\n{lt} HEAD\n".encode())
    (tmp_path / "loose.md").write_text(f"{lt} HEAD\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "table.md", "blob.bin"], check=True)
    assert cm.scan(tmp_path) == [f"table.md:4: {lt} HEAD", f"table.md:6: {eq}", f"table.md:8: {gt} topic"]
    out = subprocess.run(["python3", str(ROOT / ".ci" / "conflict_markers.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "3 merge-conflict marker line(s)" in out.stderr, out


def test_no_tracked_file_holds_a_conflict_marker():
    from .versions import missing

    if not (ROOT / ".git").exists():
        missing(f"{ROOT} is not a git checkout, so its tracked files are unknown")
    found = _conflict_markers().scan(ROOT)
    assert not found, f"merge-conflict markers (resolve each by reading both sides): {found}"


def test_demo_paths_runs_every_lesson_once_in_groups_that_share_no_trained_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_paths", ROOT / ".ci" / "demo_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    groups, lessons = module.groups(), module.lesson_models()
    assert sorted(k for g in groups for k in g) == sorted(lessons)
    models = [set().union(*(lessons[k] for k in g)) for g in groups]
    assert all(not (a & b) for i, a in enumerate(models) for b in models[i + 1:]), models
    assert groups[0] == ["scaling"]  # the widest models train first, so the last jobs are short
