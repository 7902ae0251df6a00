"""`diagnose info` on every model and data format, and every bad input through the CLI:
exit code 2, one line on stderr naming the file, no traceback, nothing written."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli

from .conftest import classifier_files

pytestmark = pytest.mark.numerics

_COUNTER = itertools.count()


def _run(*args: str):
    return CliRunner().invoke(cli, ["info", *map(str, args)])


def _tree(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


FACTORY_SRC = """
import torch.nn as nn

class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask=None):
        return self.out(self.emb(input_ids).mean(1))

def build():
    return Bag()
"""


class _Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 4)
        self.out = nn.Linear(4, 3)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A classifier checkpoint, matching data, and a factory module, in a cwd of their own."""
    monkeypatch.chdir(tmp_path)
    mask = torch.ones(10, 6, dtype=torch.long)  # [N, T]
    mask[:, 4:] = 0  # 2 of 6 positions are padding
    model = classifier_files(tmp_path, mask)
    name = f"clifactory_{next(_COUNTER)}"
    (tmp_path / f"{name}.py").write_text(FACTORY_SRC)
    torch.manual_seed(5)
    torch.save(_Bag().state_dict(), tmp_path / "w.pt")
    yield tmp_path, model, name
    sys.modules.pop(name, None)


def test_info_checkpoint_with_data(files):
    tmp, model, _ = files
    result = _run("model.pt", "--data", "eval.pt")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "(diagnose checkpoint)" in out and "diagnose.zoo.model.Transformer" in out
    assert f"{sum(p.numel() for p in model.parameters()):,}" in out
    assert "N=10  T=6" in out and "33.3% of positions" in out
    assert "sequence [10], 0..2 (3 distinct)" in out and "output      [2, 3]" in out and "labels fit" in out
    assert result.stderr == ""


def test_info_factory_and_trusted_pickle(files):
    tmp, _, name = files
    result = _run("w.pt", "--factory", f"{name}:build", "--data", "eval.pt")
    assert result.exit_code == 0, result.output
    assert "(state_dict + factory)" in result.stdout and f"{12 * 4 + 4 * 3 + 3:,}" in result.stdout and "labels fit" in result.stdout
    torch.save(nn.Linear(3, 2), tmp / "full.pt")
    result = _run("full.pt", "--trust-pickle")
    assert result.exit_code == 0 and "torch.nn.modules.linear.Linear" in result.stdout
    # Linear.forward(input) gets the ids positionally (diagnose.calling) and fails on their dtype
    _assert_clean_error(_run("full.pt", "--trust-pickle", "--data", "eval.pt"), "eval.pt", "made for this model")


def test_info_hf_folder_with_text_data(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "the", "cat", "sat", "dog"])}
    tk = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    model = BertForSequenceClassification(BertConfig(vocab_size=6, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=8,
                                                     max_position_embeddings=16, num_labels=2))
    model.save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    (tmp_path / "d.jsonl").write_text('{"text": "the cat sat", "label": 1}\n{"text": "dog", "label": 0}\n')
    result = _run(tmp_path / "bert", "--data", tmp_path / "d.jsonl", "--attn-implementation", "eager")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "BertForSequenceClassification" in out and "attn_implementation=eager" in out
    assert "N=2  T=3" in out and "33.3% of positions" in out and "output      [2, 2]" in out
    assert result.stderr == ""
    # the same folder without its tokenizer cannot read text
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bert" / name).unlink()
    _assert_clean_error(_run(tmp_path / "bert", "--data", tmp_path / "d.jsonl"), "d.jsonl",
                        "tokenizer.save_pretrained")


def _assert_clean_error(result, name: str, hint: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and name in lines[0] and hint in lines[0], lines[0]
    assert "Traceback" not in result.output and result.stdout.count("\n") <= 5


BAD_INPUTS = [
    # (files to make, CLI args, the file the message must name, a word of the fix)
    ("missing model", lambda t: None, ["nothing.pt"], "nothing.pt", "no such file"),
    ("folder without config", lambda t: (t / "empty").mkdir(), ["empty"], "empty", "save_pretrained"),
    ("not a checkpoint", lambda t: (t / "junk.pt").write_bytes(b"\x00junk"), ["junk.pt"], "junk.pt", "torch.save"),
    ("pickle without trust", lambda t: torch.save(nn.Linear(2, 2), t / "full.pt"), ["full.pt"], "full.pt",
     "--trust-pickle"),
    ("state_dict without factory", lambda t: torch.save(nn.Linear(2, 2).state_dict(), t / "sd.pt"), ["sd.pt"],
     "sd.pt", "--factory"),
    ("factory with wrong weights", lambda t: torch.save(nn.Linear(2, 2).state_dict(), t / "sd.pt"),
     ["sd.pt", "--factory", "{factory}:build"], "sd.pt", "missing"),
    ("factory missing function", lambda t: None, ["w.pt", "--factory", "{factory}:nope"], "{factory}:nope",
     "has no 'nope'"),
    ("missing data", lambda t: None, ["model.pt", "--data", "nothing.pt"], "nothing.pt", "no such file"),
    ("float ids", lambda t: torch.save({"input_ids": torch.rand(2, 3)}, t / "f.pt"), ["model.pt", "--data", "f.pt"],
     "f.pt", ".long()"),
    ("1-d ids", lambda t: torch.save({"input_ids": torch.ones(3, dtype=torch.long)}, t / "f.pt"),
     ["model.pt", "--data", "f.pt"], "f.pt", "[N, T]"),
    ("mask shape", lambda t: np.savez(t / "f.npz", input_ids=np.ones((2, 3), int), attention_mask=np.ones((2, 4), int)),
     ["model.pt", "--data", "f.npz"], "f.npz", "must match"),
    ("labels out of range", lambda t: torch.save({"input_ids": torch.ones(2, 3, dtype=torch.long),
                                                 "labels": torch.tensor([0, 7])}, t / "f.pt"),
     ["model.pt", "--data", "f.pt"], "f.pt", "[0, 3)"),
    ("token ids out of vocabulary", lambda t: torch.save({"input_ids": torch.full((2, 3), 40)}, t / "f.pt"),
     ["model.pt", "--data", "f.pt"], "f.pt", "tokenizer"),
    ("labels wrong layout", lambda t: torch.save({"input_ids": torch.ones(2, 3, dtype=torch.long),
                                                 "labels": torch.zeros(2, 3, dtype=torch.long)}, t / "f.pt"),
     ["model.pt", "--data", "f.pt"], "f.pt", "sequence labels need logits"),
    ("empty data", lambda t: torch.save({"input_ids": torch.zeros(0, 4, dtype=torch.long)}, t / "f.pt"),
     ["model.pt", "--data", "f.pt"], "f.pt", "no examples"),
    ("text without tokenizer", lambda t: (t / "f.csv").write_text("text,label\nhi,1\n"),
     ["model.pt", "--data", "f.csv"], "f.csv", "tokenizer.save_pretrained"),
    ("unknown data format", lambda t: (t / "f.txt").write_text("hi"), ["model.pt", "--data", "f.txt"], "f.txt",
     ".jsonl/.csv"),
]


@pytest.mark.parametrize("case,make,args,name,hint", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_give_one_clean_line(files, case, make, args, name, hint):
    tmp, _, factory = files
    make(tmp)
    before = _tree(tmp)
    result = _run(*(a.format(factory=factory) for a in args))
    _assert_clean_error(result, name.format(factory=factory), hint)
    assert _tree(tmp) == before  # nothing written, not even half-way


def test_info_help_and_python_m_version():
    result = CliRunner().invoke(cli, ["info", "--help"])
    assert result.exit_code == 0 and "--trust-pickle" in result.output and "--factory" in result.output
    proc = subprocess.run([sys.executable, "-m", "diagnose", "--version"], capture_output=True, text=True,
                          timeout=120, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"diagnose, version {diagnose.__version__}"
