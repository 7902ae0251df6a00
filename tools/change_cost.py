"""Count what each typical change costs, by making it: `make change-cost` (or `python tools/change_cost.py`).

For each recipe (tools/change_recipes/): the repository's files (tracked, and untracked ones git does not
ignore, so uncommitted edits count) are copied into a throwaway folder with a git baseline; the change is
made there as a contributor would make it (the library entry where built-ins of its kind live, a test that
registers nothing and finds the entry in every reader, a line in the docs); its test and the existing tests
it must keep passing run there (pytest, one thread, the copy's code: PYTHONPATH points at the copy, and
`diagnose.cli` / `diagnose.reports` are links inside it, since the editable install's finder would map them
to the real tree); and `git status --porcelain` counts the files the change touched.

Prints a markdown table (change, files, result, the files); exits 1 when a change's tests fail, a recipe no
longer applies to the code (an anchor moved), or a change needs more than --limit files (6).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from change_recipes import Recipe, RecipeRot, recipes  # noqa: E402

# the house's scans of the library and the tests (error and write policy, no assertion under an `if`, floats
# through tests/tolerance.py, imports against the layers table, the numerics marker): every change must keep
# passing them
POLICY = ("tests/test_suite_policy.py", "tests/test_error_policy.py", "tests/test_write_policy.py",
          "tests/test_layers.py", "tests/test_numerics_marker.py")
LINKS = {"diagnose/cli": "../cli", "diagnose/reports": "../reports"}  # what the editable install maps


@dataclass
class Outcome:
    recipe: Recipe
    files: list[str]
    status: str  # "pass", "FAIL", "ROT", "n/a"
    detail: str = ""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def copy_repository(repo: Path, into: Path) -> None:
    """The repository's files into `into`, committed there as the baseline, with the helper links."""
    names = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, names):
        src = repo / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree: the copy is what the tree holds now
        dst = into / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    _git(into, "init", "-q")
    exclude = into / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("".join(f"/{link}\n" for link in LINKS) + "__pycache__/\n.pytest_cache/\n")
    for link, target in LINKS.items():
        (into / link).symlink_to(target)
    _git(into, "add", "-A")
    _git(into, "-c", "user.name=change-cost", "-c", "user.email=change-cost@localhost", "commit", "-q",
         "--no-verify", "-m", "baseline")


def environment(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env.update(PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               DIAGNOSE_TEST_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def check_imports(copy: Path, python: str) -> None:
    """Refuse to count anything unless diagnose, its CLI and its report are imported from the copy."""
    probe = "import diagnose, diagnose.cli, diagnose.reports as r; print(diagnose.__file__, diagnose.cli.__file__, r.__file__)"
    out = subprocess.run([python, "-c", probe], cwd=copy, env=environment(copy), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"change-cost: importing diagnose from the copy failed:\n{out.stderr}")
    where = [Path(p).resolve() for p in out.stdout.split()]
    stray = [str(p) for p in where if not p.is_relative_to(copy.resolve())]
    if stray:
        raise SystemExit(f"change-cost: {', '.join(stray)} is not in the copy {copy}: the counts would test the "
                         "real tree; check the editable install's finder and the links in the copy")


def changed_files(copy: Path) -> list[str]:
    out = _git(copy, "status", "--porcelain", "--untracked-files=all")
    return sorted(line[3:].strip() for line in out.splitlines() if line.strip())


def reset(copy: Path) -> None:
    _git(copy, "reset", "-q", "--hard")
    _git(copy, "clean", "-q", "-fd")  # untracked, not ignored: the links and caches stay


def failing_before(copy: Path, python: str) -> list[str]:
    """The policy scans' tests that already fail on the unchanged copy: left out of every recipe's run (and
    named under the table), so that a change is judged on what it breaks."""
    scans = [p for p in POLICY if (copy / p).exists()]
    out = subprocess.run([python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *scans], cwd=copy,
                         env=environment(copy), capture_output=True, text=True)
    return [line.split()[1] for line in out.stdout.splitlines() if line.startswith("FAILED ")]


def run_recipe(recipe: Recipe, copy: Path, python: str, verbose: bool, known: list[str] = ()) -> Outcome:
    missing = [p for p in recipe.needs if not (copy / p).exists()]
    if missing:
        return Outcome(recipe, [], "n/a", f"needs {', '.join(missing)}, which this tree lacks")
    try:
        for edit in recipe.edits:
            edit(copy)
    except RecipeRot as exc:
        return Outcome(recipe, changed_files(copy), "ROT", f"{recipe.name}: {exc}")
    files = changed_files(copy)
    cmd = [python, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly", recipe.test,
           *recipe.guards, *(p for p in POLICY if (copy / p).exists()), *(f"--deselect={n}" for n in known)]
    out = subprocess.run(cmd, cwd=copy, env=environment(copy), capture_output=True, text=True)
    if verbose or out.returncode != 0:
        print(f"--- {recipe.name}: {' '.join(cmd[3:])}\n{out.stdout[-6000:]}{out.stderr[-3000:]}", file=sys.stderr)
    summary = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED") and recipe.test in line]
    if skipped:  # a skipped recipe test proves nothing: install what it needs (the `test` extra)
        return Outcome(recipe, files, "FAIL", f"its test skipped: {skipped[0]}")
    return Outcome(recipe, files, "pass" if out.returncode == 0 else "FAIL", summary)


def table(outcomes: list[Outcome], limit: int, root: Path) -> str:
    rows = ["| change | files | result | the files |", "| --- | --- | --- | --- |"]
    for o in outcomes:
        count = str(len(o.files)) if o.status != "n/a" else "-"
        over = " (over the limit)" if len(o.files) > limit else ""
        # a file the change creates is marked new (tests/test_readme.py checks that the others exist)
        listed = ", ".join(f"`{f}`" if (root / f).exists() else f"new `{f}`" for f in o.files) if o.files else o.detail
        rows.append(f"| {o.recipe.change} | {count}{over} | {o.status} | {listed} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE.parent, help="the checkout to copy (default: this one)")
    parser.add_argument("--only", action="append", default=[], help="run the recipes whose name holds this")
    parser.add_argument("--limit", type=int, default=6, help="the most files a typical change may touch")
    parser.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    parser.add_argument("--list", action="store_true", help="list the recipes and exit")
    parser.add_argument("--verbose", action="store_true", help="print each recipe's pytest output")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the policy scans on the unchanged copy (for a tree whose scans are known to "
                             "pass, as in the test suite, which runs them itself): half the time")
    args = parser.parse_args(argv)
    chosen = [r for r in recipes() if not args.only or any(o in r.name for o in args.only)]
    if args.list:
        print("\n".join(f"{r.name}: {r.change} [{', '.join(r.points)}]" for r in chosen))
        return 0
    if not chosen:
        print(f"change-cost: no recipe matches {args.only}; see --list", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="change-cost-"))
    copy = root / "repo"
    try:
        copy_repository(args.repo.resolve(), copy)
        check_imports(copy, sys.executable)
        known = [] if args.no_baseline else failing_before(copy, sys.executable)
        outcomes = []
        for recipe in chosen:
            outcomes.append(run_recipe(recipe, copy, sys.executable, args.verbose, known))
            print(f"{recipe.name}: {outcomes[-1].status}, {len(outcomes[-1].files)} files", file=sys.stderr)
            reset(copy)
    finally:
        if args.keep:
            print(f"change-cost: the copy is {copy}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"Counted by `make change-cost` on {datetime.date.today().isoformat()}: each change made in a copy of "
          f"the repository, its test run there, the files counted by `git status`.\n")
    print(table(outcomes, args.limit, args.repo.resolve()))
    notes = [f"- {o.recipe.change}: {o.recipe.note}" for o in outcomes if o.recipe.note]
    problems = [o for o in outcomes if o.status in ("FAIL", "ROT") or len(o.files) > args.limit]
    if notes:
        print("\n" + "\n".join(notes))
    if known:
        print(f"\nLeft out of every recipe's run, failing before any change: {', '.join(f'`{n}`' for n in known)}.")
    for o in problems:
        print(f"change-cost: {o.recipe.name}: {o.status}, {len(o.files)} files: {o.detail}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
