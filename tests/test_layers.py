"""The layers table in docs/development.md is the truth: every import statement of every package
(lazy ones inside functions included) goes only to the packages its row names, through their public
names; the front ends (cli, reports) import no underscored name of diagnose at all; and every package
the table lists for a row is one that row really imports. A new cross-layer import fails here with
the import and the row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import diagnose

ROOT = Path(__file__).resolve().parents[1]
LIB = Path(diagnose.__file__).parent
DOC = ROOT / "docs" / "development.md"
FRONT_ENDS = ("cli", "reports")  # installed as diagnose.cli and diagnose.reports
PACKAGES = sorted({p.parent.name for p in LIB.glob("*/__init__.py")} | set(FRONT_ENDS))


def _table() -> dict[str, tuple[str, set[str] | None]]:
    """package -> (its row as written, the packages it may import; None: any)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Layers", 1)[1].split("\n### ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) == 2 else None
        if name:
            named = set(re.findall(r"`(\w+)`", cells[1])) & set(PACKAGES)
            rows[name.group(1)] = (line.strip(), None if "any package" in cells[1] else named)
    return rows


def _files(package: str) -> list[Path]:
    if package == "top":  # the top-level modules (diagnose/__init__.py names its exports as strings)
        return sorted(p for p in LIB.glob("*.py") if p.name != "__init__.py")
    folder = ROOT / package if package in FRONT_ENDS else LIB / package
    return sorted(folder.rglob("*.py"))


def _module_of(path: Path, package: str) -> list[str]:
    """The file's dotted name as installed: diagnose.<package>.<...>."""
    if package == "top":
        return ["diagnose", path.stem]
    folder = ROOT / package if package in FRONT_ENDS else LIB / package
    return ["diagnose", package, *path.relative_to(folder).with_suffix("").parts]


def _imports(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names imported from it) for every import statement in the file."""
    here = _module_of(path, package)  # (a package's __init__ counts as a module inside it, as Python resolves it)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, module, [alias.name for alias in node.names]))
    return out


def _targets(module: str, names: list[str]) -> list[tuple[str, str, str]]:
    """(layer, what is imported, its private part or "") for each thing one import statement reaches:
    a package of the table, or "top" for a top-level module of diagnose."""
    parts = module.split(".")
    if parts[0] != "diagnose":
        return []
    if len(parts) > 1:
        layer = parts[1] if parts[1] in PACKAGES else "top"
        private = [p for p in parts[2 if layer != "top" else 1:] if p.startswith("_")]
        private += [n for n in names if n.startswith("_") and not n.startswith("__")]
        what = f"from {module} import {', '.join(names)}" if names else f"import {module}"
        return [(layer, what, ", ".join(private))]
    out = []  # `from diagnose import x`: a subpackage, a top-level module, or a name the package exports
    for name in names:
        home = diagnose._EXPORTS.get(name, ".").split(".")[1]  # "write_report": ".reports" -> reports
        layer = name if name in PACKAGES else (home if home in PACKAGES else "top")
        private = name if name.startswith("_") and not name.startswith("__") else ""
        out.append((layer, f"from diagnose import {name}", private))
    return out


def _crossings():
    """(package, file:line, layer reached, what, private part) for every import that leaves its package
    ("top": the top-level modules, which the table's rows do not list but whose imports are scanned too)."""
    for package in [*PACKAGES, "top"]:
        for path in _files(package):
            for line, module, names in _imports(path, package):
                for layer, what, private in _targets(module, names):
                    if layer != package:
                        yield package, f"{path.relative_to(ROOT)}:{line}", layer, what, private


def test_the_table_has_one_row_per_package():
    rows = _table()
    assert sorted(rows) == PACKAGES, (f"docs/development.md's layers table has rows for {sorted(rows)}; the "
                                      f"packages are {PACKAGES}: add or remove a row")


def test_every_import_is_one_the_table_allows():
    rows = _table()
    wrong = [f"{where}: `{what}` reaches {layer}; the row is {rows[package][0]}"
             for package, where, layer, what, _ in _crossings()
             if package != "top" and layer != "top" and rows[package][1] is not None and layer not in rows[package][1]]
    assert not wrong, ("imports the layers table (docs/development.md, ### Layers) does not allow; import "
                       "through a package the row names, or change the row if the layer should:\n" + "\n".join(wrong))


def test_the_table_names_no_import_that_is_not_there():
    used: dict[str, set[str]] = {p: set() for p in [*PACKAGES, "top"]}
    for package, _, layer, _, _ in _crossings():
        used[package].add(layer)
    for package, (row, allowed) in _table().items():
        stale = sorted((allowed or set()) - used[package])
        assert not stale, f"the row {row} names {stale}, which {package} does not import: drop it from the row"


def test_no_package_reaches_into_another_ones_private_names():
    front = [f"{where}: `{what}` ({private} is private)" for package, where, layer, what, private in _crossings()
             if private and (package in FRONT_ENDS or layer != "top")]
    assert not front, ("private imports across layers: import the public name (add it to that package's "
                       "__init__ and __all__; the front ends' top-level helpers are in diagnose.display, "
                       "diagnose.files and diagnose.distributed):\n" + "\n".join(front))


def test_the_scan_reads_relative_lazy_and_package_level_imports():
    found = {(layer, what) for package, _, layer, what, _ in _crossings() if package == "demo"}
    assert ("reports", "from diagnose import write_report") in found  # `from .. import write_report`, inside a function
    found = {(layer, private) for package, _, layer, _, private in _crossings() if package == "monitor"}
    assert ("top", "_json") in found  # `from .. import _json`: a top-level helper, allowed inside the library
    found = {what for package, _, layer, what, _ in _crossings() if package == "top" and layer == "adapters"}
    assert "from diagnose.adapters import GenericAdapter, named_sites" in found  # sites.py, relative
    rows = _table()
    assert rows["cli"][1] is None and rows["zoo"][1] == set() and rows["reports"][1] == {"ablation", "io", "monitor"}


@pytest.mark.parametrize("name", ["display", "files", "distributed"])
def test_the_front_ends_helpers_are_public_modules_with_all(name):
    module = __import__(f"diagnose.{name}", fromlist=["__all__"])
    assert module.__all__ and all(callable(getattr(module, n)) for n in module.__all__)
