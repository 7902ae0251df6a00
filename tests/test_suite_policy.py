"""Tests that hold anywhere (issue 24): no test reads a clock or the resident memory to judge a
budget (those belong in bench/, with figures), and no assertion sits under an `if`, where a branch
never taken would let it pass without testing anything."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "monotonic", "process_time", "time", "perf_counter_ns", "monotonic_ns", "getrusage"}


def _test_files() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(HERE).as_posix(), ast.parse(p.read_text(encoding="utf-8")))
            for p in sorted(HERE.rglob("*.py"))]


def _clock_reads(tree: ast.AST) -> int:
    """Calls such as time.perf_counter() or resource.getrusage(): a clock or a memory gauge."""
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in CLOCKS and isinstance(n.func.value, ast.Name)
               and n.func.value.id in ("time", "resource"))


def _asserts_under_if(tree: ast.AST) -> int:
    """Assertions inside an `if` statement of a test function (comprehension filters are fine)."""
    count = 0
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
            for node in ast.walk(fn):
                if isinstance(node, ast.If):
                    count += sum(isinstance(sub, ast.Assert) for sub in ast.walk(node))
    return count


def _found() -> Counter:
    found: Counter = Counter()
    for path, tree in _test_files():
        if path == "test_suite_policy.py":
            continue
        if n := _clock_reads(tree):
            found[path, "clock"] = n
        if n := _asserts_under_if(tree):
            found[path, "assert under if"] = n
    return found


def test_no_budget_on_a_clock_and_no_assertion_under_an_if():
    found = _found()
    over = {key: n for key, n in found.items() if n > 0}
    assert not over, (f"{over}: measure time and memory in bench/ (with figures in bench/README.md), and "
                      "assert what does not depend on the machine; an assertion under an `if` may never run")


def test_the_scan_sees_both():
    tree = ast.parse("import time\ndef test_x():\n    t = time.perf_counter()\n    if t:\n        assert t\n"
                     "    assert all(x for x in [1] if x)\n")
    assert (_clock_reads(tree), _asserts_under_if(tree)) == (1, 1)
