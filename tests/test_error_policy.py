"""Every user mistake raises a DiagnoseError: the library raises no bare built-in exception except
where a protocol asks for one, and every exception class it defines is a DiagnoseError or an
internal signal listed here, with its reason."""

from __future__ import annotations

import ast
import builtins
from collections import Counter
from pathlib import Path

import diagnose
from diagnose import errors

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("diagnose", "reports", "cli")  # reports/ and cli/ ship as diagnose.reports and diagnose.cli
BUILTIN_ERRORS = {name for name, obj in vars(builtins).items()  # warnings are notes, not errors
                  if isinstance(obj, type) and issubclass(obj, BaseException) and not issubclass(obj, Warning)}

# Not user mistakes, so not counted: NotImplementedError marks an abstract method, and a module's
# __getattr__ (PEP 562) must raise AttributeError.
PROTOCOL = {"NotImplementedError"}
# (file, exception) -> (how many raises are allowed, why a built-in is right there)
ALLOWED = {
    ("diagnose/ablation/result.py", "KeyError"): (1, "HeadsResult.head(layer, head) is a lookup by key"),
    ("diagnose/registry.py", "KeyError"): (1, "Registry.mapping() is a Mapping, whose protocol raises KeyError"),
    ("diagnose/prune/_remote_model.py", "ValueError"): (
        2, "copied into a pruned model folder and run by transformers without diagnose installed"),
    ("diagnose/monitor/hf.py", "ImportError"): (1, "an optional dependency is missing, as Python says it"),
    ("diagnose/monitor/lightning.py", "ImportError"): (1, "an optional dependency is missing, as Python says it"),
    ("diagnose/monitor/_follow.py", "KeyboardInterrupt"): (
        2, "the follower's own Ctrl-C handler re-raises the press Python would have raised"),
}
INTERNAL_EXCEPTIONS = {
    ("diagnose/checks/_finding.py", "SkipCheck"): "a check's signal to the runner, which records it as skipped",
}


def _library_files() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(encoding="utf-8")))
            for top in LIBRARY for p in sorted((ROOT / top).rglob("*.py"))]


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else None


def _builtin_raises() -> Counter:
    found: Counter = Counter()
    for path, tree in _library_files():
        getattrs = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                    for n in ast.walk(f)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and node.exc is not None) or id(node) in getattrs:
                continue
            if (name := _raised_name(node)) in BUILTIN_ERRORS - PROTOCOL:
                found[path, name] += 1
    return found


def test_no_bare_builtin_raise_for_a_user_mistake():
    found = _builtin_raises()
    allowed = {key: n for key, (n, _why) in ALLOWED.items()}
    for key, n in found.items():
        limit = allowed.get(key, 0)
        assert n <= limit, (f"{key[0]} raises a bare {key[1]} ({n}x, {limit} allowed): raise a "
                            f"diagnose.errors class (DataError/ConfigError are ValueErrors, UsageError a "
                            f"TypeError, StateError a RuntimeError), or list it in ALLOWED with its reason")


def test_the_allowlist_is_not_stale():
    """An allowed raise that is gone leaves a hole a new one could slip through: drop the entry."""
    found = _builtin_raises()
    for key, (n, why) in ALLOWED.items():
        assert found[key], f"{key}: no such raise is left ({n} allowed: {why}); drop the entry from ALLOWED"


def test_every_exception_class_is_a_diagnose_error():
    public = set(errors.__all__)
    for path, tree in _library_files():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in
                     node.bases}
            if not bases & (BUILTIN_ERRORS | public) or path == "diagnose/errors.py":
                continue
            if (path, node.name) in INTERNAL_EXCEPTIONS:
                continue
            assert bases & public, f"{path}: {node.name} derives from {sorted(bases)}, not from a diagnose.errors class"


def test_the_errors_are_exported_and_keep_the_builtins_callers_catch():
    for name in errors.__all__:
        cls = getattr(diagnose, name)
        assert cls is getattr(errors, name) and name in diagnose.__all__
        assert issubclass(cls, diagnose.DiagnoseError)
    defined = {n for n, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, Exception)}
    assert defined == set(errors.__all__), "a class of diagnose.errors is missing from its __all__"
    for cls, builtin in ((errors.DataError, ValueError), (errors.ConfigError, ValueError),
                         (errors.UsageError, TypeError), (errors.StateError, RuntimeError)):
        assert issubclass(cls, builtin)
