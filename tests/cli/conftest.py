"""Fixtures the CLI tests share. A module that needs other files defines its own `files`, which
takes precedence in that module."""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.zoo import ModelConfig, Transformer

from ..wordlevel import WORDS, saved_with_tokenizer


def classifier_files(folder, mask: "torch.Tensor | None" = None) -> torch.nn.Module:
    """Save a tiny classifier checkpoint (model.pt) and matching data (eval.pt, with `mask` as its
    attention_mask when given) in `folder`; returns the model."""
    model = Transformer(ModelConfig(kind="classifier", vocab_size=12, n_classes=3, max_len=8, n_layers=1,
                                    n_heads=2, d_model=16))
    diagnose.save_checkpoint(model, folder / "model.pt")
    ids = torch.randint(1, 12, (10, 6))  # [N, T]
    extra = {} if mask is None else {"attention_mask": mask}
    torch.save({"input_ids": ids, **extra, "labels": torch.arange(10) % 3}, folder / "eval.pt")
    return model


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A tiny classifier checkpoint (model.pt) and matching data (eval.pt) in a cwd of their own."""
    monkeypatch.chdir(tmp_path)
    classifier_files(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny BERT classifier folder with the word-level tokenizer (max 16 positions)."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=len(WORDS) + 4, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16, num_labels=2)
    return saved_with_tokenizer(BertForSequenceClassification(cfg), tmp_path_factory.mktemp("bert"))
