"""describe_model / describe_data / trial_forward against numbers worked out independently."""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.errors import DataError
from diagnose.io import DataSet, describe_data, describe_model, trial_forward
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


def _data(labels: torch.Tensor | None, T: int = 5) -> DataSet:
    ids = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 0, 0]])[:, :T]  # [N, T]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])[:, :T]  # [N, T]: 2 of 10 padding
    return DataSet(ids, mask, labels, "mem.pt")


def test_describe_reference_model_and_data(tmp_path):
    model = Transformer(ModelConfig(kind="lm", vocab_size=8, n_layers=1, n_heads=2, d_model=8, d_ff=16))
    model.head.weight.requires_grad_(False)
    loaded = diagnose.load_model(diagnose.save_checkpoint(model, tmp_path / "m.pt"))
    loaded.head.weight.requires_grad_(False)
    info = describe_model(loaded)
    # embeddings 8*8 + positions 64*8 + block (2 LN 4*8, qkv 8*24+24, proj 8*8+8, fc 8*16+16, proj 16*8+8)
    # + final LN 2*8 + head 8*8+8
    block = 4 * 8 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 16 + 16) + (16 * 8 + 8)
    total = 8 * 8 + 64 * 8 + block + 2 * 8 + 8 * 8 + 8
    assert info["parameters"] == total and info["trainable"] == total - 8 * 8
    assert info["config"]["n_heads"] == 2 and info["format"] == "diagnose checkpoint"
    labels = torch.tensor([[2, 3, 4, 5, -100], [4, 3, -100, -100, -100]])  # [N, T]
    d = describe_data(_data(labels))
    assert d["padding_share"] == pytest.approx(0.2) and d["token_ids"] == [0, 5]
    assert d["labels"] == {"shape": [2, 5], "kind": "token", "min": 2, "max": 5, "distinct": 4,
                           "scored_share": pytest.approx(0.6)}
    assert trial_forward(loaded, _data(labels)) == {"output_shape": [2, 5, 8], "labels_fit": True,
                                                    "last_position_only": False}


def test_probe_catches_misfits():
    model = Transformer(ModelConfig(kind="classifier", vocab_size=6, n_classes=2, max_len=4, n_layers=1,
                                    n_heads=1, d_model=4)).eval()
    assert trial_forward(model, _data(torch.tensor([0, 1]), T=4))["output_shape"] == [2, 2]
    assert trial_forward(model, _data(None, T=4))["labels_fit"] is None
    with pytest.raises(DataError, match=r"mem.pt: labels go up to 2, but the model has 2 outputs"):
        trial_forward(model, _data(torch.tensor([0, 2]), T=4))
    with pytest.raises(DataError, match="mem.pt: labels of shape .N, T. do not match"):
        trial_forward(model, _data(torch.zeros(2, 4, dtype=torch.long), T=4))
    with pytest.raises(DataError, match="mem.pt: the model fails on the first examples .DataError: sequence length 5"):
        trial_forward(model, _data(torch.tensor([0, 1]), T=5))


def test_describe_hf_model(gpt2_folder):
    info = describe_model(diagnose.load_model(gpt2_folder[0], attn_implementation="eager"))
    assert info["class"] == "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"
    assert info["config"]["num_hidden_layers"] == 2 and info["config"]["attn_implementation"] == "eager"
    assert "num_labels" not in info["config"] and info["tokenizer"] is not None
    assert info["parameters"] == sum(p.numel() for p in gpt2_folder[1].parameters())
