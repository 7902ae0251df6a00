"""README: "Everything written is strict JSON, written atomically." Held here: in the library every
file write goes through diagnose._write.atomic_write and every JSON text through diagnose._json,
except the writes listed below, each with the reason it cannot (an append-only log, a format
another library writes)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("diagnose", "reports", "cli")
HOMES = {"diagnose/_write.py", "diagnose/_json.py"}  # the one writer and the one JSON policy
WRITERS = {"write_text", "write_bytes", "save_file", "copyfile", "copy2", "copytree", "dump", "savez", "to_csv",
           "save_pretrained", "SummaryWriter"}

# (file, call) -> (how many, why it is not atomic_write / _json)
ALLOWED = {
    ("diagnose/monitor/_runfolder.py", "open(a)"): (
        1, "metrics.jsonl and alerts.jsonl are logs appended one whole line per record; readers skip a torn last line"),
    ("diagnose/monitor/_tensorboard.py", "SummaryWriter"): (
        1, "TensorBoard's event files, written by its own writer (the export's, and the live sink's as the run goes)"),
    ("diagnose/zoo/pretrained.py", "save_pretrained"): (
        2, "a Hugging Face folder for the tests and benches, written by transformers itself"),
    ("diagnose/prune/save.py", "save_pretrained"): (
        2, "written by transformers into a temporary folder that is renamed into place whole"),
    ("cli/prune.py", "save_pretrained"): (1, "PruneResult.save_pretrained: diagnose's own folder writer (prune/save.py)"),
    ("reports/_heads_json.py", "json.dumps"): (1, "encodes one key inside a document being read, not a write"),
    ("diagnose/demo/_shipped.py", "json.dumps"): (1, "a plain copy of a recipe (dumps then loads), not a write"),
}


def _name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute):
        owner = f.value.id if isinstance(f.value, ast.Name) else ""
        if (owner, f.attr) in {("torch", "save"), ("json", "dumps")}:
            return f"{owner}.{f.attr}"
        return f.attr if f.attr in WRITERS else None
    if isinstance(f, ast.Name):
        if f.id == "open":
            mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"),
                                                                 None)
            text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            return f"open({text[0]})" if set(text) & set("wax+") else None
        return f.id if f.id in WRITERS else None
    return None


def _name_of(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _scan(tree: ast.AST) -> list[str]:
    """The write calls in `tree`; a content function handed to the writer (atomic_write, or its core
    replace_atomically) is the writer's own."""
    inside = {id(n) for call in ast.walk(tree)
              if isinstance(call, ast.Call) and _name_of(call) in ("atomic_write", "replace_atomically")
              for arg in call.args[1:2] for n in ast.walk(arg)}
    return [name for node in ast.walk(tree)
            if isinstance(node, ast.Call) and id(node) not in inside and (name := _name(node))]


def _writes() -> Counter:
    """(file, call) -> count, for every write call outside the homes."""
    found: Counter = Counter()
    for top in LIBRARY:
        for p in sorted((ROOT / top).rglob("*.py")):
            path = p.relative_to(ROOT).as_posix()
            if path not in HOMES:
                found.update((path, name) for name in _scan(ast.parse(p.read_text(encoding="utf-8"))))
    return found


def test_every_write_goes_through_the_one_writer_and_the_one_json_policy():
    found = _writes()
    for key, n in found.items():
        limit = ALLOWED.get(key, (0, ""))[0]
        assert n <= limit, (f"{key[0]} writes with {key[1]} ({n}x, {limit} allowed): write through "
                            f"diagnose._write.atomic_write and JSON through diagnose._json.dumps")


def test_the_allowlist_is_not_stale():
    """An entry whose write is gone would let a new one slip in: drop it."""
    found = _writes()
    for key, (n, why) in ALLOWED.items():
        assert found[key], f"{key}: no such call is left ({n} allowed: {why}); drop the entry from ALLOWED"


def test_the_scan_sees_a_plain_write():
    """The scan itself: the classic non-atomic writes are caught, a read and a content function
    handed to atomic_write are not."""
    tree = ast.parse("import json, torch\n"
                     "p.write_text(json.dumps(x))\nopen(p, 'w')\nopen(p)\nopen(p, mode='rb')\ntorch.save(x, p)\n"
                     "atomic_write(p, lambda f: torch.save(x, f))\n")
    assert sorted(_scan(tree)) == ["json.dumps", "open(w)", "torch.save", "write_text"]
