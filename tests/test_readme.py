"""The README is a first read that must stay true: its Python example runs, every command has an
example whose flags exist, every page under docs/ is reachable from it, and every figure it quotes
is the figure of a page that says how it was measured."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.numerics

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks of `text` whose info string is `lang` ("" for bare fences)."""
    blocks, current, info = [], None, ""
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                if info == lang:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_is_a_first_read():
    lines = README.splitlines()
    assert len(lines) < 200
    first_screen = "\n".join(lines[:40])
    assert "](docs/report.png)" in first_screen
    assert _blocks(_section("Quick start"), "") == ["make demo\n", "make test\n"]


@pytest.mark.slow
def test_your_own_model_example_runs(tmp_path, monkeypatch):
    """The example, as printed, on a small Hugging Face classifier folder and a data file."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=2)
    transformers.BertForSequenceClassification(cfg).eval().save_pretrained(tmp_path / "my-model")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (24, 8), generator=g)
    torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}, tmp_path / "eval.pt")
    (code,) = _blocks(_section("Your own model"), "python")
    assert len(code.splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    heads = json.loads((tmp_path / "heads.json").read_text())
    assert heads["schema"] == "diagnose.heads/2" and len(heads["heads"]) == 4
    assert (tmp_path / "report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_every_command_has_an_example_and_every_example_flag_exists():
    from diagnose.cli.main import cli as main

    def examples_in(text: str) -> dict[str, list[list[str]]]:
        found: dict[str, list[list[str]]] = {}
        for block in _blocks(text, ""):
            for line in block.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("diagnose "):
                    words = shlex.split(line)
                    found.setdefault(words[1], []).append(words[2:])
        return found

    examples = examples_in(README)
    assert set(main.commands) <= set(examples), f"commands without an example: {set(main.commands) - set(examples)}"
    for page in sorted((ROOT / "docs").glob("*.md")):  # the reference pages' examples must run too
        for name, uses in examples_in(page.read_text()).items():
            examples.setdefault(name, []).extend(uses)
    for name, uses in examples.items():
        assert name in main.commands, f"README runs `diagnose {name}`, which does not exist"
        flags = {opt for p in main.commands[name].params for opt in p.opts + p.secondary_opts}
        for words in uses:
            for w in (w for w in words if w.startswith("-")):
                assert w in flags, f"README: `diagnose {name} {w}` is not an option of {name}"


def test_every_docs_page_is_reachable_from_the_readme():
    linked = set(re.findall(r"\]\(((?:docs|bench)/[^)#]+)", README))
    for target in linked:
        assert (ROOT / target).is_file(), f"README links to {target}, which does not exist"
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"bench/README.md"}
    assert pages <= linked, f"pages not linked from the README: {sorted(pages - linked)}"
    for page in pages:  # links between pages point at files that exist
        text = (ROOT / page).read_text()
        for target in re.findall(r"\]\(([^)#:]+\.md)", text):
            assert (ROOT / page).parent.joinpath(target).resolve().is_file(), f"{page} links to missing {target}"


def test_files_and_names_the_pages_mention_exist():
    """Modules move: a page that names a file or a dotted name must name one that exists (but for a file
    marked new: the change-cost table lists the files a typical change creates)."""
    import importlib

    pages = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        for path in set(re.findall(r"(?<!new `)(?<![\w/])((?:diagnose|tests|bench|cli|reports)/[\w/]+\.py)\b", text)):
            assert (ROOT / path).is_file(), f"{page.name} names {path}, which does not exist"
        for dotted in set(re.findall(r"`(diagnose(?:\.\w+)+)(?![\w/-])", text)):
            parts = dotted.split(".")
            for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    assert hasattr(obj, attr), f"{page.name} names {dotted}: no {attr}"
                    obj = getattr(obj, attr)
                break


# A figure: a number with a unit of measure (seconds, bytes, a percentage, points, millions) or a
# ratio written as 1.71x. "80 x 64" (a shape) and bare counts are not figures.
_FIGURE = re.compile(r"(?<![\w.,])(\d+(?:[.,]\d+)*)(?:\s?(%|ms|s|min|minutes|MB|GB|GiB|MiB|M|points)|(x))(?![\w])")


def _figures(text: str) -> set[str]:
    """Each figure of `text` outside code blocks, spelled "<number> <unit>" ("1.71x" for ratios)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {f"{n}x" if x else f"{n} {unit}" for n, unit, x in _FIGURE.findall(prose)}


def test_every_figure_the_readme_quotes_is_on_a_page_that_measured_it():
    pages = [ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    measured = set().union(*(_figures(p.read_text()) for p in pages))
    quoted = _figures(README)
    assert len(quoted) > 20, sorted(quoted)  # the pattern still finds the README's figures
    missing = sorted(quoted - measured)
    assert not missing, f"README quotes figures no page of docs/ or bench/README.md gives: {missing}"


def test_the_figure_pattern():
    text = "in 12.6 s and 609 MB, 1.71x faster, 56 %, 80 x 64 heads, 4 GiB, ±2.3 points\n```\n9.9 s\n```\n"
    assert _figures(text) == {"12.6 s", "609 MB", "1.71x", "56 %", "4 GiB", "2.3 points"}
