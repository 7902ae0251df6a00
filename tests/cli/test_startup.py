"""The CLI starts without torch: `diagnose --help` must be instant, and its choices must
still be the library's own."""

from __future__ import annotations

import subprocess
import sys

import diagnose
from diagnose.ablation import METHODS
from diagnose.cli import heads
from diagnose.objectives import TASKS


def test_help_does_not_import_torch_or_pandas():
    code = ("import sys; import diagnose.cli.main; "
            "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_choices_match_the_library():
    from diagnose.ablation import engine, significance

    assert heads.TASKS == TASKS and heads.METHODS == METHODS
    assert heads.RANKINGS == engine.RANKINGS and heads.RANKINGS[0] == engine.FAST_RANK
    assert significance.CORRECTIONS == ("holm", "bh")


def test_every_public_name_resolves():
    for name in diagnose.__all__:
        assert getattr(diagnose, name) is not None, name
