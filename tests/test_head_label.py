"""One spelling of a head's name, "L0.H1", everywhere: the helper, its Jinja filter, and a scan of
the code, templates and scripts so that a hand-made second spelling ("L0H1") cannot come back."""

from __future__ import annotations

import re
from pathlib import Path

from diagnose._head_label import head_label, heads_label

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "diagnose" / "_head_label.py"
# a head's label built by hand: f"L{layer}H{head}" or f"L{layer}.H{head}" (Python), H{{ ... }} (Jinja),
# "H" + head or ".H" + head (JavaScript)
HAND_MADE = {
    ".py": re.compile(r"L\{[^{}]*\}\.?H\{"),
    ".j2": re.compile(r"H\{\{"),
    ".js": re.compile(r"[\"']\.?H[\"']\s*\+"),
}


def test_the_one_spelling():
    assert head_label(0, 1) == "L0.H1" and heads_label([(0, 1), (12, 3)]) == "L0.H1 + L12.H3"
    assert heads_label([(2, 0), (2, 1)], ", ") == "L2.H0, L2.H1"


def test_the_report_filter_spells_it_the_same():
    from diagnose.reports._render import _env

    assert _env().from_string("{{ layer|head_label(head) }}").render(layer=3, head=7) == head_label(3, 7)


def test_no_second_spelling_in_code_templates_or_scripts():
    places = [ROOT / d for d in ("diagnose", "cli", "reports", ".ci", "bench")]
    files = [p for d in places for p in d.rglob("*") if p.suffix in HAND_MADE and p != HELPER]
    assert len(files) > 100 and any(p.suffix == ".j2" for p in files) and any(p.suffix == ".js" for p in files)
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if HAND_MADE[p.suffix].search(line)]
    assert not found, "label heads with diagnose._head_label.head_label (Jinja: |head_label):\n" + "\n".join(found)
