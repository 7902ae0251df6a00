"""The typical changes of docs/development.md's change-cost table, each written as a contributor would
write it: the library entry in the file where built-ins of its kind live, a test proving that the entry
reaches every reader (registering nothing itself), and a line in the docs page of its kind.

A recipe is data: its edits (new files, lines inserted at an anchor) and the tests to run once they are
made. An anchor that is no longer in its file is an error naming the recipe and the anchor (the recipe has
rotted: the code it was written against moved), never a silent skip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent
from typing import Callable

Edit = Callable[[Path], None]


class RecipeRot(Exception):
    """A recipe's anchor is gone from the file it edits."""


@dataclass(frozen=True)
class Recipe:
    """One typical change: `edits` made in a copy of the repository, then `test` (new) and `guards`
    (existing tests the change must keep passing) run there."""

    name: str  # a short id for --only
    change: str  # the row's words in the change-cost table
    points: tuple[str, ...]  # the plug-in points it exercises (rows of docs/development.md's plug-in tables)
    edits: tuple[Edit, ...]
    test: str  # the path of its new test
    guards: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # paths the copy must hold for this recipe to apply (an API being built)
    note: str = ""  # what the count leaves out or assumes, printed under the table
    extra: dict = field(default_factory=dict)


def _read(root: Path, path: str) -> str:
    target = root / path
    if not target.exists():
        raise RecipeRot(f"{path} is not in the repository")
    return target.read_text()


def new(path: str, text: str) -> Edit:
    """A new file (an error if it exists: the recipe would count an edit as a new file)."""
    def edit(root: Path) -> None:
        target = root / path
        if target.exists():
            raise RecipeRot(f"{path} exists already")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dedent(text).lstrip("\n"))
    return edit


def insert(path: str, text: str, *, after: str | None = None, before: str | None = None) -> Edit:
    """`text` inserted after the first line holding `after` (or before the first holding `before`);
    appended at the end with neither."""
    def edit(root: Path) -> None:
        lines = _read(root, path).splitlines(keepends=True)
        add = text.strip("\n") + "\n"  # as given: a line keeps its indentation
        anchor = after if after is not None else before
        if anchor is None:
            at = len(lines)
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
        else:
            found = [i for i, line in enumerate(lines) if anchor in line]
            if not found:
                raise RecipeRot(f"{path}: no line holds {anchor!r}")
            at = found[0] + (1 if after is not None else 0)
        lines.insert(at, add)
        (root / path).write_text("".join(lines))
    return edit


def append_entry(path: str, opener: str, text: str) -> Edit:
    """`text` (an entry, indented as the others) as the last item of the built-in tuple or list that opens on
    the line starting with `opener` (`_BUILTINS = (`) and closes on the first line after it that is `)` or `]`."""
    def edit(root: Path) -> None:
        lines = _read(root, path).splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.startswith(opener)]
        if not starts:
            raise RecipeRot(f"{path}: no line starts with {opener!r}")
        ends = [i for i in range(starts[0] + 1, len(lines)) if lines[i].rstrip() in (")", "]")]
        if not ends:
            raise RecipeRot(f"{path}: {opener!r} never closes on a line of its own")
        lines.insert(ends[0], text.strip("\n") + "\n")
        (root / path).write_text("".join(lines))
    return edit


def replace(path: str, old: str, new_text: str) -> Edit:
    """The one occurrence of `old` replaced."""
    def edit(root: Path) -> None:
        text = _read(root, path)
        if text.count(old) != 1:
            raise RecipeRot(f"{path}: {old!r} occurs {text.count(old)} times, not once")
        (root / path).write_text(text.replace(old, new_text))
    return edit


def recipes() -> list[Recipe]:
    """Every recipe, in the table's order."""
    from . import families, heads, monitor, monitor_alerts

    return [*heads.RECIPES, *monitor.RECIPES, *monitor_alerts.RECIPES, *families.RECIPES]
