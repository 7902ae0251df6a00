"""Layers point one way: io never imports prune (prune teaches io its folder kind), and prune uses
only other packages' public names. Read from the source (every import statement, lazy ones inside
functions included), so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import diagnose

ROOT = Path(diagnose.__file__).parent
# the house's shared helpers: top-level modules of diagnose (one JSON policy, one writer, the
# tolerance policy, number checks, the torch.distributed ranks, PEP 562 exports) whose public names every package uses
SHARED = {"_json", "_write", "_tolerance", "_numbers", "_distributed", "_lazy"}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, names imported from it) for every import in the file."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((module, [alias.name for alias in node.names]))
    return out


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_scan_reads_relative_and_lazy_imports():
    found = _imports(ROOT / "prune" / "_folder.py")
    assert ("diagnose.io", ["FolderKind", "register_folder_kind"]) in found  # `from ..io import ...`
    assert ("diagnose.io", ["weight_shapes"]) in found  # inside a function
    assert ("diagnose.prune._remote_model", ["pruned"]) in found


def test_no_module_in_io_imports_prune():
    for path in _files("io"):
        for module, names in _imports(path):
            targets = [module] + [f"{module}.{n}" for n in names]
            assert not any(t == "diagnose.prune" or t.startswith("diagnose.prune.") for t in targets), \
                f"{path.name} imports {module} {names}"


def test_prune_imports_only_public_names_of_other_packages():
    for path in _files("prune"):
        for module, names in _imports(path):
            if not module.startswith("diagnose.") or module.startswith("diagnose.prune"):
                continue
            parts = module.split(".")[1:]
            private = [p for p in parts if p.startswith("_") and not (len(parts) == 1 and p in SHARED)]
            assert not private, f"{path.name} imports the private module {module}"
            assert not [n for n in names if n.startswith("_")], f"{path.name} imports private {names} from {module}"


def test_prune_does_not_know_the_reference_model_class():
    for path in _files("prune"):
        for module, names in _imports(path):
            assert not module.startswith("diagnose.zoo"), f"{path.name} imports {module} {names}"
