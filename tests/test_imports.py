"""Every module of diagnose imports, and every command's --help runs, on this Python and these
versions. CI's version rows run only the `numerics` tests (docs/development.md, "CI"), so this is
what makes each row (python 3.10 with torch 2.4 on the lowest) import all of diagnose, the modules
no numerics test reaches included: a name or syntax a newer Python or library brought fails here."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli

pytestmark = pytest.mark.numerics

# optional extras a row may lack (TransformerLens is not installed on the lowest row: docs/development.md)
OPTIONAL = {"transformer_lens", "lightning", "tensorboard", "wandb", "mlflow", "transformers"}


def _unexplained_failures() -> list[str]:
    """Modules that fail to import for another reason than an optional package not installed."""
    bad = []
    for info in pkgutil.walk_packages(diagnose.__path__, "diagnose."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top not in OPTIONAL or importlib.util.find_spec(top) is not None:
                bad.append(f"{info.name}: {e!r}")
        except Exception as e:  # noqa: BLE001 (collected and reported, each with its module)
            bad.append(f"{info.name}: {e!r}")
    return bad


def test_every_module_imports():
    assert len(list(pkgutil.walk_packages(diagnose.__path__, "diagnose."))) > 50
    assert not _unexplained_failures()


def test_every_command_has_help():
    names = sorted(cli.commands)
    assert {"heads", "stats", "check", "report", "demo", "prune"} <= set(names)
    for name in names:
        res = CliRunner().invoke(cli, [name, "--help"])
        assert res.exit_code == 0 and "Usage:" in res.output, (name, res.output)
