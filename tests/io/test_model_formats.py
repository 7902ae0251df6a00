"""Every model format loads back to a model that computes what the original computed."""

from __future__ import annotations

import itertools
import json
import sys

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.errors import ConfigError, InputFileError, UnsafePickleError
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import EXACT, assert_close, size_of

pytestmark = pytest.mark.numerics


def _ids(vocab: int, B: int = 3, T: int = 7) -> torch.Tensor:
    return torch.randint(4, vocab, (B, T))  # [B, T]


def test_checkpoint_round_trip_in_eval_mode(tmp_path):
    model = Transformer(ModelConfig(kind="classifier", vocab_size=16, n_classes=3, positions="rotary", dropout=0.1))
    path = diagnose.save_checkpoint(model, tmp_path / "m.pt", meta={"task": "classification"})
    # the file is plain data: the strictest loader reads it
    assert torch.load(path, weights_only=True)["format"] == "diagnose.checkpoint/1"
    loaded = diagnose.load_model(path)
    assert isinstance(loaded, Transformer) and not loaded.training
    assert loaded.diagnose_source == str(path) and loaded.diagnose_format == "diagnose checkpoint"
    assert loaded.diagnose_meta == {"task": "classification"} and loaded.diagnose_tokenizer is None
    ids, mask = _ids(16), torch.ones(3, 7, dtype=torch.long)
    mask[0, 5:] = 0
    model.eval()
    torch.testing.assert_close(loaded(ids, mask), model(ids, mask), **EXACT)


def test_save_checkpoint_refuses_other_modules(tmp_path):
    with pytest.raises(ConfigError, match="--factory"):
        diagnose.save_checkpoint(nn.Linear(2, 2), tmp_path / "x.pt")
    assert not list(tmp_path.iterdir())


def test_hf_causal_lm_folder_with_tokenizer(gpt2_folder):
    folder, original = gpt2_folder
    model = diagnose.load_model(folder)
    assert type(model).__name__ == "GPT2LMHeadModel" and not model.training
    assert model.diagnose_source == str(folder) and model.diagnose_format == "Hugging Face folder"
    with pytest.raises(InputFileError, match=f"give the folder {folder} itself"):
        diagnose.load_model(folder / "model.safetensors")
    assert type(diagnose.load_model(folder / "config.json")).__name__ == "GPT2LMHeadModel"
    tok = model.diagnose_tokenizer
    assert tok.convert_tokens_to_ids(["the", "cat"]) == [4, 5] and tok.pad_token == "[PAD]"
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, **EXACT)


def test_hf_attn_implementation_is_passed_through(gpt2_folder):
    folder, original = gpt2_folder
    default = diagnose.load_model(folder)
    eager = diagnose.load_model(folder, attn_implementation="eager")
    assert default.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    ids = _ids(default.config.vocab_size)
    with torch.no_grad():
        assert_close(eager(ids).logits, original(ids).logits, **size_of(original))  # eager vs sdpa: other sums


def test_hf_unknown_attn_implementation_is_a_config_error(gpt2_folder):
    with pytest.raises(ConfigError, match="attn_implementation"):
        diagnose.load_model(gpt2_folder[0], attn_implementation="no_such_kernel")


def test_hf_sequence_classifier_folder(bert_folder):
    folder, original = bert_folder
    model = diagnose.load_model(folder)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.label2id == {"neg": 0, "neutral": 1, "pos": 2}
    ids = _ids(model.config.vocab_size)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits,
                                   original(input_ids=ids, attention_mask=mask).logits, **EXACT)


def test_hf_folder_without_tokenizer_and_without_architectures(tmp_path):
    from transformers import BertConfig, BertModel

    original = BertModel(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=16, max_position_embeddings=16)).eval()
    original.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("architectures", None)  # AutoModel is the fallback
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = diagnose.load_model(tmp_path)
    assert type(model).__name__ == "BertModel" and model.diagnose_tokenizer is None
    ids = _ids(20)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, original(ids).last_hidden_state, **EXACT)


def test_hf_folder_missing_weights_for_its_class_is_refused(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=16)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["BertForSequenceClassification"]  # its classifier would be random
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputFileError, match=r"lack \d+ tensors .*classifier"):
        diagnose.load_model(tmp_path)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, input_ids):
        return self.out(self.emb(input_ids).mean(1))  # [B, 3]


FACTORY_SRC = """
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.emb = nn.Embedding(10, width)
        self.out = nn.Linear(width, 3)

    def forward(self, input_ids):
        return self.out(self.emb(input_ids).mean(1))

def build():
    return Tiny()

def build_wide():
    return Tiny(width=6)

def not_a_model():
    return 42

def broken():
    raise RuntimeError("no weights for you")

VALUE = 3
"""


_COUNTER = itertools.count()


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """A module in the cwd, named per test so sys.modules never serves a stale one."""
    name = f"tinyfactory_{next(_COUNTER)}"
    (tmp_path / f"{name}.py").write_text(FACTORY_SRC)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def _tiny_state(seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return Tiny().state_dict()


@pytest.mark.parametrize("wrap", ["plain", "lightning"])
def test_factory_with_torch_state_dict(tmp_path, factory_module, wrap):
    state = _tiny_state()
    torch.save(state if wrap == "plain" else {"state_dict": state, "epoch": 3}, tmp_path / "w.pt")
    model = diagnose.load_model(tmp_path / "w.pt", factory=f"{factory_module}:build")
    assert not model.training and model.diagnose_format == "state_dict + factory"
    for k, v in state.items():
        assert torch.equal(model.state_dict()[k], v)
    assert str(tmp_path) not in sys.path  # the cwd was only on sys.path while importing


def test_factory_with_safetensors_and_file_path(tmp_path, factory_module):
    from safetensors.torch import save_file

    state = _tiny_state(2)
    save_file(state, tmp_path / "w.safetensors")
    model = diagnose.load_model(tmp_path / "w.safetensors", factory=f"{tmp_path / factory_module}.py:build")
    ref = Tiny()
    ref.load_state_dict(state)
    ids = torch.randint(0, 10, (2, 5))  # [B, T]
    torch.testing.assert_close(model(ids), ref(ids), **EXACT)


@pytest.mark.parametrize("spec_fmt,exc,pattern", [
    ("{m}", ConfigError, "expected module:function"),
    ("{m}:", ConfigError, "expected module:function"),
    ("no_such_module_xyz:build", ConfigError, "cannot import no_such_module_xyz"),
    ("{m}:missing", ConfigError, "has no 'missing'"),
    ("{m}:VALUE", ConfigError, "not callable"),
    ("{m}:not_a_model", ConfigError, "returned a int"),
    ("{m}:broken", ConfigError, "RuntimeError: no weights for you"),
    ("{m}:build_wide", InputFileError, r"wrong shape \(e.g. emb.weight: \(10, 4\) in the file, \(10, 6\)"),
])
def test_factory_errors(tmp_path, factory_module, spec_fmt, exc, pattern):
    torch.save(_tiny_state(), tmp_path / "w.pt")
    with pytest.raises(exc, match=pattern):
        diagnose.load_model(tmp_path / "w.pt", factory=spec_fmt.format(m=factory_module))


def test_factory_key_mismatch_names_the_keys(tmp_path, factory_module):
    state = _tiny_state()
    state["extra.weight"] = state.pop("out.bias")
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(InputFileError, match=r"1 missing \(e.g. out.bias\); 1 unexpected \(e.g. extra.weight\)"):
        diagnose.load_model(tmp_path / "w.pt", factory=f"{factory_module}:build")


def test_pickled_module_needs_trust(tmp_path):
    torch.manual_seed(3)
    original = Tiny()
    torch.save(original, tmp_path / "full.pt")
    with pytest.raises(UnsafePickleError, match="runs code.*--trust-pickle"):
        diagnose.load_model(tmp_path / "full.pt")
    model = diagnose.load_model(tmp_path / "full.pt", trust_pickle=True)
    assert model.diagnose_format == "pickled module" and not model.training
    ids = torch.randint(0, 10, (2, 5))  # [B, T]
    torch.testing.assert_close(model(ids), original(ids), **EXACT)


class _Touch:
    """Unpickling this creates a file: proof of whether the loader ran the file's code."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        from pathlib import Path
        return Path.touch, (Path(self.target),)


def test_untrusted_pickle_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"payload": _Touch(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(UnsafePickleError, match="needs .*getattr"):
        diagnose.load_model(tmp_path / "evil.pt")
    assert not marker.exists()


@pytest.mark.parametrize("make,pattern", [
    (lambda p: None, "no such file or folder"),
    (lambda p: p.mkdir(), "folder without config.json"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "gpt2"}')), "no weights"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "gpt2"'),
                (p / "model.safetensors").write_bytes(b"x")), "config.json: not valid JSON"),
    (lambda p: p.write_bytes(b"definitely not a torch file"), "not a file torch.load can read"),
    (lambda p: p.write_bytes(b""), "not a file torch.load can read"),
    (lambda p: torch.save({"epochs": 3, "name": "x"}, p), "holds a dict, not a model"),
    (lambda p: torch.save([1, 2], p), "holds a list, not a model"),
    (lambda p: torch.save(Tiny().state_dict(), p), "state_dict .* --factory"),
    (lambda p: torch.save({"input_ids": torch.zeros(2, 3, dtype=torch.long)}, p), "data file .* --data"),
    (lambda p: torch.save({"format": "diagnose.checkpoint/9", "config": {}}, p), "diagnose.checkpoint/9"),
    (lambda p: torch.save({"format": "diagnose.checkpoint/1", "config": {"n_layers": 1}, "state_dict": {}}, p),
     "damaged diagnose checkpoint"),
])
def test_bad_model_files(tmp_path, make, pattern):
    path = tmp_path / "model.pt"
    make(path)
    with pytest.raises(InputFileError, match=pattern) as info:
        diagnose.load_model(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_safetensors_without_factory(tmp_path):
    from safetensors.torch import save_file

    save_file(Tiny().state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(InputFileError, match="weights only.*--factory"):
        diagnose.load_model(tmp_path / "w.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(InputFileError, match="not a readable safetensors file"):
        diagnose.load_model(tmp_path / "bad.safetensors")
