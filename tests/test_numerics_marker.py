"""Every test whose outcome can change with the CPU kernel path, the thread count or the installed
versions carries the `numerics` marker (issue 30): CI runs the whole suite once, and only the
marked tests under the other kernel paths, the second thread layout and the two version rows
(docs/development.md, "CI"). A test left unmarked would silently lose that coverage, so the rule is
mechanical and conservative (it marks too much rather than miss), read off each test file's AST:

A test file is *numerics* when it, a helper module of tests/ it imports (transitively), or a
conftest.py fixture it names does any of:
- compares floats: imports tests/tolerance.py or diagnose._tolerance;
- trains: calls `.backward(`, `train(`, `fit(` or `TrainingMonitor`, or imports diagnose.zoo.train
  or diagnose.demo (the lessons train; the shipped models' verdicts are judged on this CPU);
- compiles: torch.compile, torch._dynamo, torch.jit;
- reads a version: tests/versions.py's torch_before, `__version__`, importlib.metadata,
  sys.version_info, diagnose's TRACED_HOOKS (a torch-version switch);
- runs a library the version matrix moves: transformers, transformer_lens, lightning, accelerate
  (imported, or named to pytest.importorskip or tests/versions.py's required);
- runs torch.distributed or torchrun;
- ablates: calls ablate_heads, ablate_together or prune_heads (verdicts judged against margins).
Code in string literals (scripts a test runs in a subprocess) counts too. Such a file must say
`pytestmark = pytest.mark.numerics` (or a list holding it) at module level; an unmarked file that
touches none of these may still be marked by hand.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "numerics"
LIBRARIES = {"transformers", "transformer_lens", "lightning", "pytorch_lightning", "accelerate"}
CALLS = {"backward": "trains (calls .backward)", "train": "trains (calls train)", "fit": "trains (calls fit)",
         "TrainingMonitor": "trains under TrainingMonitor", "compile": "compiles (torch.compile)",
         "torch_before": "reads the torch version (torch_before)", "TRACED_HOOKS": "reads a torch-version switch (TRACED_HOOKS)",
         "__version__": "reads a version (__version__)", "version_info": "reads the Python version (sys.version_info)",
         "run_lessons": "trains the demo's lessons", "run_demo": "runs the demo (trains the lessons)",
         **dict.fromkeys(("ablate_heads", "ablate_together", "prune_heads"),
                         "ablates (its verdicts are judged against margins on this CPU's sums)")}
# calls whose first argument names a library: pytest.importorskip("transformers"), required("lightning", ...)
BY_NAME = {"importorskip", "required", "find_spec", "import_module"}
MODULES = {"_tolerance": "compares floats (diagnose._tolerance)", "tolerance": "compares floats (tests/tolerance.py)",
           "diagnose.zoo.train": "trains (diagnose.zoo.train)", "diagnose.demo": "uses the demo (trains, or judges shipped models)",
           "torch._dynamo": "compiles (torch._dynamo)", "torch.jit": "compiles (torch.jit)",
           "torch.distributed": "runs torch.distributed", "importlib.metadata": "reads package versions (importlib.metadata)"}
# what a subprocess script in a string literal may do
TEXT = re.compile(r"\.backward\(|TrainingMonitor|torch\.compile|torchrun|torch\.distributed|\btrain\(|__version__")


def _imported(node: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names, level) an import statement brings in."""
    if isinstance(node, ast.Import):
        return [(a.name, [], 0) for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(node.module or "", [a.name for a in node.names], node.level)]
    return []


def _bound(node: ast.AST) -> set[str]:
    """The names an import statement binds (`import torch.distributed as dist` binds dist)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    return set()


def _module_reasons(module: str, names: list[str], level: int) -> list[str]:
    found = []
    full = [module] + [f"{module}.{n}" if module else n for n in names]
    for m in full:
        first, last = m.split(".")[0], m.split(".")[-1]
        if first in LIBRARIES and level == 0:
            found.append(f"runs {first}, whose version the matrix moves")
        for key, why in MODULES.items():
            if m == key or m.startswith(key + ".") or (key in ("tolerance", "_tolerance") and last == key):
                found.append(why)
    return found


def reasons(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, why) for each thing in tree that makes a test numerics (the rule above)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for module, names, level in _imported(node):
            found += [(line, why) for why in _module_reasons(module, names, level)]
            found += [(line, CALLS[n]) for n in names if n in CALLS]
        if isinstance(node, ast.Attribute) and node.attr in CALLS:
            if node.attr != "compile" or (isinstance(node.value, ast.Name) and node.value.id == "torch"):
                found.append((line, CALLS[node.attr]))
        elif isinstance(node, ast.Name) and node.id in CALLS and node.id != "compile":
            found.append((line, CALLS[node.id]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                getattr(node.func, "attr", getattr(node.func, "id", None)) in BY_NAME and \
                str(node.args[0].value).split(".")[0] in LIBRARIES:
            found.append((line, f"runs {node.args[0].value}, whose version the matrix moves"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := TEXT.search(node.value)):
            found.append((line, f"runs code that says {m.group(0)!r} (a script in a string)"))
    return found


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _helper(path: Path, module: str, level: int) -> Path | None:
    """The tests/ module an import statement in path names, if it is one (relative, or a sibling
    put on sys.path such as reports/report_fixtures)."""
    base = path.parent
    for _ in range(max(level - 1, 0)):
        base = base.parent
    parts = module.split(".") if module else []
    for candidate in ([base.joinpath(*parts).with_suffix(".py")] if parts else []) + \
                     ([path.parent.joinpath(*parts).with_suffix(".py")] if parts and level == 0 else []):
        if candidate.is_file() and HERE in candidate.parents:
            return candidate
    return None


@cache
def _top(path: Path) -> dict[str, ast.AST]:
    """path's module-level statements by the names they bind (defs, classes, assignments, imports)."""
    out: dict[str, ast.AST] = {}
    for node in _tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(node.name, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, node)
        for name in _bound(node):
            out.setdefault(name, node)
    return out


def _used(node: ast.AST) -> set[str]:
    """The names node reads, and the parameters of the functions in it (fixtures it asks for)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
           {a.arg for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            for a in n.args.args + n.args.kwonlyargs}


def _followed(path: Path, node: ast.AST, seen: set) -> list[str]:
    """The reasons behind the tests/ helpers the imports inside node bring in: only the names
    imported (`from ..hooks import snapshot`), or the whole module (`from .. import nano`)."""
    found: list[str] = []
    for sub in ast.walk(node):
        for module, names, level in _imported(sub):
            helper = _helper(path, module, level)
            if _module_reasons(module, names, level):
                continue  # the import itself is the reason (tests/tolerance.py)
            if helper is not None:
                found += _closure(helper, set(names) or set(_top(helper)), seen)
            elif level:
                for name in names:
                    if (whole := _helper(path, name, level)) is not None:
                        found += _closure(whole, set(_top(whole)), seen)
    return found


def _closure(path: Path, names: set[str], seen: set) -> list[str]:
    """Why the module-level names of a helper or conftest are numerics: their own code, and the
    module-level names and tests/ helpers they use, transitively."""
    rel = path.relative_to(HERE.parent).as_posix()
    top, found = _top(path), []
    for name in sorted(names):
        node = top.get(name)
        if node is None or (path, name) in seen:
            continue
        seen.add((path, name))
        found += [f"{rel}:{line} ({name}) {why}" for line, why in reasons(node)]
        found += _followed(path, node, seen)
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            found += _closure(path, _used(node) & set(top), seen)
    return found


def _fixtures(path: Path) -> dict[str, Path]:
    """The conftest.py on path's folder chain that defines each name, nearest first."""
    out: dict[str, Path] = {}
    folder = path.parent
    while folder == HERE or HERE in folder.parents:
        conftest = folder / "conftest.py"
        if conftest.is_file():
            for name, node in _top(conftest).items():
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.setdefault(name, conftest)
        folder = folder.parent
    return out


def why_numerics(path: Path) -> list[str]:
    """Why a test file is numerics (the rule above), each reason with the file and line it is at:
    the whole file, what it takes from tests/ helpers, and the conftest fixtures it asks for."""
    rel = path.relative_to(HERE.parent).as_posix()
    tree, seen = _tree(path), set()
    found = [f"{rel}:{line} {why}" for line, why in reasons(tree)]
    found += _followed(path, tree, seen)
    used = _used(tree) - set(_top(path))
    for name, conftest in _fixtures(path).items():
        if name in used:
            found += _closure(conftest, {name}, seen)
    return list(dict.fromkeys(found))


def marked(tree: ast.Module) -> bool:
    """The module says pytestmark = pytest.mark.numerics, or a list or tuple holding it."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and node.value is not None:
                if any(isinstance(n, ast.Attribute) and n.attr == MARK for n in ast.walk(node.value)):
                    return True
    return False


def _test_files() -> list[Path]:
    return sorted(p for p in HERE.rglob("test_*.py") if p != Path(__file__).resolve())


def unmarked() -> dict[str, list[str]]:
    """Test files the rule calls numerics that do not carry the marker, with the reasons."""
    out = {}
    for path in _test_files():
        if not marked(_tree(path)) and (why := why_numerics(path)):
            out[path.relative_to(HERE.parent).as_posix()] = why
    return out


def test_every_numerics_test_file_is_marked():
    missing = unmarked()
    lines = [f"  {path}: add `pytestmark = pytest.mark.{MARK}` at module level (with `import pytest`), because\n"
             + "\n".join(f"      {why}" for why in why[:4]) + (f"\n      ... and {len(why) - 4} more" if len(why) > 4 else "")
             for path, why in missing.items()]
    assert not missing, ("these test files touch numerics, training, compilation, a version or a library the "
                         "version matrix moves, so CI must run them under every kernel path, thread layout and "
                         "version row (tests/test_numerics_marker.py, docs/development.md \"CI\"):\n" + "\n".join(lines))


def test_the_rule_sees_each_kind():
    src = '''
from ..tolerance import approx
from diagnose.zoo import train
from ..versions import torch_before
import transformers
import torch.distributed as dist
pytest.importorskip("transformer_lens")
def test_x(model):
    loss.backward()
    torch.compile(m)
    y = torch.__version__
    run("import torch; torch.distributed.init_process_group()")
    re.compile("x")
'''
    whys = [why for _, why in reasons(ast.parse(src))]
    for part in ("tolerance", "trains (calls train)", "torch_before", "runs transformers", "torch.distributed",
                 ".backward", "torch.compile", "__version__", "a script in a string", "runs transformer_lens"):
        assert any(part in why for why in whys), (part, whys)
    assert not reasons(ast.parse("import re, json\ndef test_y():\n    assert re.compile('a').match('a')\n"))
    assert marked(ast.parse("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.numerics]\n"))
    assert not marked(ast.parse("import pytest\npytestmark = pytest.mark.slow\n"))


def test_the_marker_is_declared(pytestconfig):
    markers = pytestconfig.getini("markers")
    assert any(m.split(":")[0].strip() == MARK for m in markers), markers
