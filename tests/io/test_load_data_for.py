"""Text data from Python (issue 24, item 10): `diagnose.load_data_for(model, path)` reads text the
way the CLI does, for a model loaded from a folder (its tokenizer attached) and for a model built
in memory (tokenizer=), and a model in memory goes to ablate_heads as it is."""

from __future__ import annotations

import json

import pytest
import torch

import diagnose
from diagnose.errors import DataError

from ..wordlevel import make_tokenizer
from .conftest import VOCAB

pytestmark = pytest.mark.numerics

ROWS = [{"text": "the cat sat on the mat", "label": "pos"}, {"text": "a dog ran", "label": "neg"},
        {"text": "the big red dog", "label": "neutral"}, {"text": "a cat ran on a mat", "label": "pos"}] * 3


@pytest.fixture
def dev(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _in_memory_bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, num_labels=3,
                     label2id={"neg": 0, "neutral": 1, "pos": 2}, id2label={0: "neg", 1: "neutral", 2: "pos"})
    return BertForSequenceClassification(cfg).eval()


def test_public_and_exported():
    assert "load_data_for" in diagnose.__all__
    from diagnose.io import load_data_for

    assert diagnose.load_data_for is load_data_for


def test_a_model_in_memory_with_its_tokenizer_then_ablated_as_it_is(dev):
    model, tok = _in_memory_bert(), make_tokenizer()
    with pytest.raises(DataError, match="tokenizer=tok"):  # nothing attached: the message says what to pass
        diagnose.load_data_for(model, dev)
    data = diagnose.load_data_for(model, dev, tokenizer=tok)
    assert data.labels.tolist() == [2, 0, 1, 2] * 3  # label names through the model's config
    assert data.input_ids[1].tolist()[:5] == tok("a dog ran")["input_ids"]
    same = diagnose.load_data(dev, tokenizer=tok, label2id=model.config.label2id)
    assert torch.equal(same.input_ids, data.input_ids) and torch.equal(same.labels, data.labels)
    result = diagnose.ablate_heads(model, data, task="classification", progress=False)
    assert {(h.layer, h.head) for h in result.heads} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert result.to_json()["n_examples"] == len(ROWS)


def test_a_loaded_folder_uses_its_own_tokenizer(dev, bert_folder):
    folder, _ = bert_folder
    model = diagnose.load_model(folder)
    data = diagnose.load_data_for(model, dev)
    assert data.tokens[1][:5] == ["[CLS]", "a", "dog", "ran", "[SEP]"]
    other = make_tokenizer(words=["dog", "a", "ran", "the", "cat", "sat", "on", "mat", "big", "red"])
    assert diagnose.load_data_for(model, dev, tokenizer=other).input_ids[1, 1:4].tolist() == [5, 4, 6]  # "a dog ran"
