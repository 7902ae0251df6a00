"""Tiny Hugging Face folders with offline tokenizers, built once per test module."""

from __future__ import annotations

import pytest

from ..wordlevel import WORDS, make_tokenizer, saved_with_tokenizer

VOCAB = len(WORDS) + 4


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """(folder, original model): GPT2LMHeadModel with its tokenizer saved beside it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32, bos_token_id=2,
                     eos_token_id=3, pad_token_id=0)
    return _saved(tmp_path_factory, "gpt2", GPT2LMHeadModel(cfg).eval())


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """(folder, original model): BertForSequenceClassification (3 labels, named) with its tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, num_labels=3,
                     id2label={0: "neg", 1: "neutral", 2: "pos"}, label2id={"neg": 0, "neutral": 1, "pos": 2})
    return _saved(tmp_path_factory, "bert", BertForSequenceClassification(cfg).eval())


def _saved(tmp_path_factory, name, model):
    """(folder, model): the model saved with the test tokenizer beside it, as a user would."""
    return saved_with_tokenizer(model, tmp_path_factory.mktemp(name)), model


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()
