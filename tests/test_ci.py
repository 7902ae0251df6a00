"""`.ci/run` must not go green without the browser: a failed Chromium install stops it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_run_stops_when_chromium_cannot_be_installed(tmp_path):
    script = (ROOT / ".ci" / "run").read_text()
    assert "DIAGNOSE_TEST_THREADS=1 make test" in script
    assert "OMP_WAIT_POLICY=PASSIVE make versions-newest" in script
    assert "/usr/bin/chromium" in script
    # The same script, in a copy of the tree where chromium is absent and apt-get fails;
    # `make` is a stub that records each target it was asked for.
    (tmp_path / ".ci").mkdir()
    run = tmp_path / ".ci" / "run"
    run.write_text(script.replace("/usr/bin/chromium", str(tmp_path / "no-chromium")))
    (tmp_path / ".ci" / "kernel-paths").write_text("echo default\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("apt-get", "echo apt: no chromium here; exit 100"), ("make", f'echo "$1" >> {tmp_path / "make.log"}')):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(run)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0
    assert "could not install chromium" in out.stderr and "apt: no chromium here" in out.stderr  # its log, printed
    # it installs beside the main venv; no test starts without it
    assert "test" not in (tmp_path / "make.log").read_text().split()


def _run_ci_with_stub_make(tmp_path, paths: list[str], fail_on: str = "") -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """.ci/run in a copy of the tree on a CPU with these kernel paths, whose `make` is a stub recording,
    per call, the kernel path, torch threads, OMP wait policy and arguments (and failing, saying so,
    on `make <fail_on>`)."""
    (tmp_path / ".ci").mkdir()
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    script = (ROOT / ".ci" / "run").read_text().replace("/usr/bin/chromium", str(chromium))
    (tmp_path / ".ci" / "run").write_text(script)
    (tmp_path / ".ci" / "kernel-paths").write_text(f"echo {' '.join(paths)}\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "make.log"
    (stubs / "make").write_text(
        "#!/bin/sh\n"
        f'echo "${{ATEN_CPU_CAPABILITY:-native}} ${{DIAGNOSE_TEST_THREADS:--}} ${{OMP_WAIT_POLICY:--}} $*" >> {log}\n'
        f'if [ "$1" = "{fail_on}" ]; then echo "pip: no matching distribution for {fail_on}"; exit 3; fi\n')
    (stubs / "make").chmod(0o755)
    out = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}, timeout=120)
    return out, [line.split(maxsplit=3) for line in log.read_text().splitlines()]


def test_kernel_paths_lists_this_cpus_paths_widest_first():
    paths = subprocess.run(["bash", str(ROOT / ".ci" / "kernel-paths")], capture_output=True, text=True,
                           check=True).stdout.split()
    assert paths[-1] == "default" and len(set(paths)) == len(paths)
    assert paths == [p for p in ("avx512", "avx2", "default") if p in paths]


@pytest.mark.parametrize("paths", [["avx512", "avx2", "default"], ["avx2", "default"], ["default"]])
def test_ci_covers_every_kernel_path_and_version_row_in_three_passes(tmp_path, paths):
    """Pass A: the whole `make test` on the native (widest) path, main row, one thread per worker;
    pass B: the newest row's numerics tests on the second path, two threads per worker (passive
    OpenMP waits); pass C: the lowest row's on the third (pass i on path i mod n). Every path this CPU
    has and both rows run; the rows install in the background before they are needed. First the
    conflict-marker check, last the demo on each path and the wheel."""
    out, calls = _run_ci_with_stub_make(tmp_path, paths)
    assert out.returncode == 0, out.stderr
    background = ("venv-newest", "venv-lowest", "wheel-check WHEEL_STAGE=venv")
    foreground = [c for c in calls if not c[3].startswith(background)]
    targets = [c[3].split()[0] for c in foreground]
    assert targets[:5] == ["conflicts", "venv", "test", "versions-newest", "versions-lowest"]
    assert sorted(targets[5:]) == ["demo-paths", "wheel-check"]  # side by side, in either order
    assert any(c[3].startswith("wheel-check WHEEL_STAGE=check WHEEL_WORK=/") for c in foreground)  # the venv's folder
    passes = {c[3]: tuple(c[:3]) for c in foreground if c[3] in ("test", "versions-newest", "versions-lowest")}
    assert passes == {"test": (paths[0], "1", "-"), "versions-newest": (paths[1 % len(paths)], "2", "PASSIVE"),
                      "versions-lowest": (paths[2 % len(paths)], "1", "-")}
    assert {path for path, _, _ in passes.values()} == set(paths)  # every path at least once
    order = [c[3] for c in calls]
    assert order.count("venv-newest") == order.count("venv-lowest") == 1
    assert order.index("venv") < order.index("venv-newest") < order.index("versions-newest")
    assert order.index("venv-newest") < order.index("venv-lowest") < order.index("versions-lowest")
    assert f"demo-paths PATHS={' '.join(paths)}" in order
    venv = next(i for i, c in enumerate(order) if c.startswith("wheel-check WHEEL_STAGE=venv"))
    assert order.index("venv-lowest") < venv < next(i for i, c in enumerate(order) if "WHEEL_STAGE=check" in c)


def test_a_row_that_fails_to_install_stops_ci_with_its_log(tmp_path):
    out, calls = _run_ci_with_stub_make(tmp_path, ["avx2", "default"], fail_on="venv-lowest")
    assert out.returncode != 0
    assert "installing the lowest row's venv failed (make venv-lowest, exit 3)" in out.stderr, out.stderr
    assert "pip: no matching distribution for venv-lowest" in out.stderr  # the install's own log, printed
    order = [c[3] for c in calls]
    assert "versions-newest" in order and "versions-lowest" not in order
    assert not [c for c in order if "WHEEL_STAGE=check" in c or c.startswith("demo-paths")]


def test_the_numerics_target_and_both_version_rows_select_the_marker():
    makefile = (ROOT / "Makefile").read_text()
    out = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "test-numerics", "test", "STAMP=pyproject.toml"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert [line.split(" -m pytest ")[1] for line in out if " -m pytest " in line] == ["-q -rs -n 2 --dist loadfile -m numerics ",
                                                              "-q -rs -n 2 --dist loadfile "]
    assert "VERSIONS_TEST ?= test-numerics" in makefile
    assert "$(MAKE) $(VERSIONS_TEST) $(LOWEST_ROW)" in makefile and "$(MAKE) $(VERSIONS_TEST) $(NEWEST_ROW)" in makefile


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


def _demo_paths():
    """.ci/demo_paths.py, the script make demo-paths runs, imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_paths", ROOT / ".ci" / "demo_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_paths_runs_every_lesson_once_in_groups_that_share_no_trained_model():
    module = _demo_paths()
    groups, lessons = module.groups(), module.lesson_models()
    assert sorted([k for g in groups for k in g] + module.on_shipped()) == sorted(lessons)
    assert module.on_shipped() == ["heads", "induction"]  # the `main` job's, on the sweeps it makes anyway
    models = [set().union(*(lessons[k] for k in g)) for g in groups]
    assert all(not (a & b) for i, a in enumerate(models) for b in models[i + 1:]), models
    assert groups[0] == ["scaling"]  # the widest models train first, so the last jobs are short


@pytest.mark.parametrize("paths", [["avx512", "avx2", "default"], ["avx2", "default"], ["default"]])
def test_demo_paths_covers_every_group_on_every_path_and_trains_a_wiring_group_once(paths):
    """Every group of lessons and the shipped models' sweeps run on every path; a WIRING group (its
    verdicts decided by the wiring, whatever the weights) trains on the first path only, and each
    other path checks those weights, after every job that trains, longest first."""
    module = _demo_paths()
    groups = [",".join(g) for g in module.groups()]
    wiring = [k for k in groups if set(k.split(",")) <= set(module.WIRING)]
    assert wiring == ["scaling"]  # the widest models: half of all the training demo-paths did
    jobs = module.schedule(paths, module.groups())
    assert sorted((p, k) for p, k, _ in jobs) == sorted((p, k) for k in groups + ["main"] for p in paths)
    assert [(p, s) for p, k, s in jobs if k in wiring] == [(paths[0], None)] + [(p, paths[0]) for p in paths[1:]]
    assert jobs[0] == (paths[0], groups[0], None)  # the longest first
    checked = [i for i, (_, _, s) in enumerate(jobs) if s]
    assert all(i > j for i in checked for j, (_, k, s) in enumerate(jobs) if not s)  # last: the weights are written


def test_the_files_with_a_slow_test_come_first_and_xdist_keeps_that_order(request):
    """tests/conftest.py: `make test`'s xdist workers (--dist loadfile) take the long files first, so that
    neither waits alone on one at the end (xdist's own reorder, files with more tests first, is off)."""
    items = request.session.items
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    order = [item.path in slow for item in items]
    assert order == sorted(order, reverse=True)
    assert getattr(request.config.option, "loadscopereorder", False) is False
