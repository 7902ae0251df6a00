"""Hostile and broken inputs through the CLI (issue 13, the reading side).

Every case ends with exit code 2 and one line on stderr that names the file and a fix:
no traceback, no hang, no prompt, no code from a model folder run, nothing written.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.io import save_tensors
from diagnose.zoo import ModelConfig, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
import report_fixtures as rf  # noqa: E402


def _invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def assert_refused(res, *names: str, fix: str | None = None) -> str:
    """Exit 2, one `error:` line on stderr naming every one of `names` (and `fix`), no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    if fix is not None:
        assert fix in lines[0], (fix, lines[0])
    return lines[0]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- code that must not run --------------------------------------------------------------

_OWN_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PretrainedConfig, PreTrainedModel

class EvilConfig(PretrainedConfig):
    model_type = "evilnet"

class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def _own_code_folder(tmp_path: Path, model_type: str = "evilnet", base: Path | None = None) -> tuple[Path, Path]:
    """(folder, marker): a model folder whose .py files write `marker` if anything imports them."""
    folder = tmp_path / "remote"
    folder.mkdir()
    marker = tmp_path / "MARKER"
    if base is not None:  # a real folder of a built-in family, with an auto_map added
        for p in base.iterdir():
            (folder / p.name).write_bytes(p.read_bytes())
        config = json.loads((folder / "config.json").read_text())
    else:
        config = {"architectures": ["EvilModel"], "hidden_size": 8}
        (folder / "model.safetensors").write_bytes(b"{}")
    config.update(model_type=model_type, architectures=["EvilModel"],
                  auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
                            "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(_OWN_CODE.format(marker=str(marker)))
    if (folder / "tokenizer_config.json").exists():
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        tok["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
        (folder / "tokenization_evil.py").write_text(_OWN_CODE.format(marker=str(marker)))
    return folder, marker


def test_own_code_folder_refused_without_prompt_or_running_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-home" / "modules"))
    folder, marker = _own_code_folder(tmp_path)
    before = _tree(folder)
    res = _invoke("info", folder, input="y\n" * 20)  # a user who would answer yes to any prompt
    line = assert_refused(res, folder, "evilnet", fix="--factory")
    assert "built-in" in line
    assert "custom code" not in res.output and "[y/N]" not in res.output
    assert not marker.exists(), "a file of the model folder ran"
    assert not (tmp_path / "hf-home" / "modules").exists()
    assert _tree(folder) == before


def test_builtin_family_with_auto_map_loads_the_builtin_class_and_runs_nothing(tmp_path, monkeypatch):
    """A known model_type with an auto_map: the built-in class is used, the folder's code never imported."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ..wordlevel import make_tokenizer

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    base = tmp_path / "base"
    GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=8)).save_pretrained(base)
    make_tokenizer().save_pretrained(base)
    folder, marker = _own_code_folder(tmp_path, model_type="gpt2", base=base)
    res = _invoke("info", folder, input="y\n" * 20)
    assert "[y/N]" not in res.output
    assert not marker.exists(), "a file of the model folder ran"
    assert not (tmp_path / "modules").exists()
    if res.exit_code == 0:
        assert "GPT2" in res.output
    else:  # the tokenizer's own class is refused: still one line, still nothing run
        assert_refused(res, folder)


@pytest.mark.slow
def test_own_code_folder_in_a_real_process_with_yes_on_stdin(tmp_path):
    """What the issue saw: `yes | diagnose info FOLDER` ran the folder's code. Now: refused."""
    folder, marker = _own_code_folder(tmp_path)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "home" / "hf")}
    env.pop("HF_MODULES_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "diagnose", "info", str(folder)], input="y\n" * 50,
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and str(folder) in proc.stderr, proc.stderr
    assert "[y/N]" not in proc.stdout + proc.stderr
    assert not marker.exists()
    assert not list((tmp_path / "home").rglob("modules"))


def test_hf_loader_passes_trust_remote_code_false_everywhere():
    """Every from_pretrained in the package says trust_remote_code=False (a grep, so new calls count too)."""
    root = Path(diagnose.__file__).resolve().parent
    calls = []
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ".from_pretrained(" in line and not line.lstrip().startswith("#"):
                calls.append((path.name, n, line))
    assert calls, "no from_pretrained found: the test looks in the wrong place"
    for name, n, line in calls:
        assert "trust_remote_code=False" in line or "**kwargs" in line, f"{name}:{n}: {line.strip()}"
    hf = (root / "io" / "hf.py").read_text()
    assert '"trust_remote_code": False' in hf


# --- checkpoints ----------------------------------------------------------------------------

@pytest.fixture
def files(tmp_path, monkeypatch):
    """A tiny classifier checkpoint and matching data in a cwd of their own."""
    monkeypatch.chdir(tmp_path)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=12, n_classes=3, max_len=8, n_layers=1,
                                    n_heads=2, d_model=16))
    diagnose.save_checkpoint(model, tmp_path / "model.pt")
    ids = torch.randint(1, 12, (10, 6))  # [N, T]
    save_tensors({"input_ids": ids, "labels": torch.arange(10) % 3}, tmp_path / "eval.pt")
    return tmp_path


def _edit_checkpoint(src: Path, dst: Path, **changes) -> Path:
    obj = torch.load(src, weights_only=True)
    for key, value in changes.items():
        if key == "meta":
            obj["meta"] = value
        else:
            obj["config"][key] = value
    torch.save(obj, dst)
    return dst


@pytest.mark.parametrize("changes,words", [
    ({"n_layers": 10**9}, "n_layers=1000000000"),
    ({"n_layers": math.inf}, "n_layers must be an integer"),
    ({"n_heads": 0}, "n_heads must be at least 1"),
    ({"d_model": -16}, "d_model must be at least 1"),
    ({"d_ff": 10**9}, "d_ff=1000000000"),
    ({"max_len": 10**12}, "max_len=1000000000000"),
    ({"vocab_size": 10**10}, "vocab_size=10000000000"),
    ({"dropout": math.nan}, "dropout must be a finite number"),
    ({"positions": ["learned"]}, "positions=['learned']"),
    ({"meta": [1, 2]}, "meta is a list"),
    ({"meta": "x"}, "meta is a str"),
], ids=lambda v: str(v)[:30])
def test_damaged_checkpoint_config_one_line_before_building(files, changes, words):
    import time

    bad = _edit_checkpoint(files / "model.pt", files / "bad.pt", **changes)
    start = time.perf_counter()
    res = _invoke("info", bad)
    assert_refused(res, bad, words, fix="diagnose.save_checkpoint")
    assert time.perf_counter() - start < 5, "the model was built before the config was checked"


def test_checkpoint_state_dict_not_tensors(files):
    obj = torch.load(files / "model.pt", weights_only=True)
    obj["state_dict"] = {"tok_emb.weight": [1, 2]}
    torch.save(obj, files / "bad.pt")
    assert_refused(_invoke("info", "bad.pt"), "bad.pt", "state_dict", fix="save_checkpoint")


# --- pickles --------------------------------------------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pickles(tmp_path: Path) -> dict[str, Path]:
    marker = tmp_path / "PWNED"
    out = {"zip": tmp_path / "evil-zip.pt", "raw": tmp_path / "evil-raw.pt", "proto0": tmp_path / "evil-p0.pt"}
    torch.save({"w": _Evil(marker)}, out["zip"])
    import pickle

    out["raw"].write_bytes(pickle.dumps({"w": _Evil(marker)}, protocol=4))
    out["proto0"].write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    return out


@pytest.mark.parametrize("kind", ["zip", "raw", "proto0"])
def test_malicious_pickle_refused_naming_trust_pickle_not_torch_advice(files, kind):
    path = _pickles(files)[kind]
    line = assert_refused(_invoke("info", path), path, fix="--trust-pickle")
    assert "weights_only" not in line and "Re-running" not in line
    assert not (files / "PWNED").exists()


def test_factory_with_trust_pickle_is_not_told_to_pass_trust_pickle(files):
    (files / "fac_hostile.py").write_text("import torch.nn as nn\ndef build():\n    return nn.Linear(2, 2)\n")
    weird = files / "weird.pt"  # a state_dict pickled with a class of its own
    torch.save({"weight": torch.zeros(2, 2), "bias": torch.zeros(2), "extra": _HolderLike()}, weird)
    res = _invoke("info", weird, "--factory", "fac_hostile:build")
    assert_refused(res, weird, fix="--trust-pickle")
    res = _invoke("info", weird, "--factory", "fac_hostile:build", "--trust-pickle")
    line = assert_refused(res, weird)
    assert "--trust-pickle" not in line
    sys.modules.pop("fac_hostile", None)


class _HolderLike:
    pass
