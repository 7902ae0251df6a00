"""The files people's own training code writes: wrapped state_dict names, a checkpoint's entries
for the factory, unsigned token ids, raw token streams, and image data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from diagnose import ConfigError, DataError, load_data
from diagnose.io import ImageSet
from diagnose.io._factory import factory_arguments, strip_wrapper_prefix
from diagnose.notes import Note

pytestmark = pytest.mark.numerics


def test_compile_and_ddp_prefixes_are_stripped_only_when_the_rest_matches():
    expected = {"a.weight": 0, "b.bias": 0}
    state = {f"module._orig_mod.{k}": torch.zeros(1) for k in expected}
    with pytest.warns(Note, match="'module.' '_orig_mod.'"):
        assert set(strip_wrapper_prefix(state, expected, Path("w.pt"))) == set(expected)
    other = {"_orig_mod.a.weight": torch.zeros(1), "_orig_mod.c.bias": torch.zeros(1)}
    assert strip_wrapper_prefix(other, expected, Path("w.pt")) is other  # the rest differs: left to the match error
    mixed = {"_orig_mod.a.weight": torch.zeros(1), "b.bias": torch.zeros(1)}
    assert strip_wrapper_prefix(mixed, expected, Path("w.pt")) is mixed


def test_the_factory_gets_the_checkpoint_entries_its_parameters_name():
    extras = {"model_args": {"n_layer": 2}, "iter_num": 5}

    def by_args(model_args, iter_num=0, other=None):
        return model_args

    assert factory_arguments(by_args, extras, "m:f", Path("ckpt.pt")) == extras
    assert factory_arguments(lambda: None, extras, "m:f", Path("ckpt.pt")) == {}
    with pytest.raises(ConfigError, match=r"parameter 'config' names no entry of ckpt.pt \(it holds iter_num, "
                                          r"model_args\)"):
        factory_arguments(lambda config: None, extras, "m:f", Path("ckpt.pt"))


def test_nanogpt_like_checkpoint_loads_with_weights_only_and_a_factory_taking_model_args(tmp_path, monkeypatch):
    import diagnose

    monkeypatch.chdir(tmp_path)
    (tmp_path / "own_factory_mod.py").write_text(
        "import torch.nn as nn\n\ndef build(model_args):\n    return nn.Linear(model_args['n_in'], 2)\n")
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, "optimizer": opt.state_dict(),
                "model_args": {"n_in": 3, "bias": True, "dropout": 0.0}, "iter_num": 3,
                "best_val_loss": torch.tensor(1.5), "config": {"dtype": "bfloat16", "compile": True}}, "ckpt.pt")
    with pytest.warns(Note, match="_orig_mod"):
        loaded = diagnose.load_model("ckpt.pt", factory="own_factory_mod:build")
    assert torch.equal(loaded.weight, model.weight) and torch.equal(loaded.bias, model.bias)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_unsigned_token_ids_are_widened_exactly(tmp_path, dtype):
    ids = np.array([[0, 1, 60000], [7, 8, 9]], dtype=dtype)
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    data = load_data(tmp_path / "ids.npz")
    assert data.input_ids.dtype == torch.int64 and data.input_ids.tolist() == ids.astype(np.int64).tolist()


def test_a_raw_bin_is_cut_into_windows_and_needs_a_length(tmp_path):
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "val.bin")
    data = load_data(tmp_path / "val.bin", max_length=8)
    assert data.input_ids.shape == (6, 8) and data.input_ids[1].tolist() == list(range(8, 16))
    with pytest.raises(DataError, match="pass --max-length T"):
        load_data(tmp_path / "val.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="not a whole number of uint16"):
        load_data(tmp_path / "odd.bin", max_length=8)
    torch.save({"input_ids": torch.zeros(2, 3, dtype=torch.long)}, tmp_path / "saved.bin")  # a torch.save .bin
    assert load_data(tmp_path / "saved.bin").input_ids.shape == (2, 3)


def test_pixel_values_load_as_images_with_class_labels(tmp_path):
    x = torch.randn(5, 3, 8, 8)
    torch.save({"pixel_values": x, "labels": torch.arange(5)}, tmp_path / "img.pt")
    data = load_data(tmp_path / "img.pt")
    assert isinstance(data, ImageSet) and len(data) == 5 and data.image_size == (3, 8, 8)
    (inputs, labels), = list(data.batches(8))
    assert torch.equal(inputs["pixel_values"], x) and labels.tolist() == [0, 1, 2, 3, 4]
    torch.save({"pixel_values": x, "labels": torch.zeros(5, 2, dtype=torch.long)}, tmp_path / "bad.pt")
    with pytest.raises(DataError, match=r"labels have shape \(5, 2\), but must be \[N\] = \(5,\)"):
        load_data(tmp_path / "bad.pt")
    torch.save({"pixel_values": x[0]}, tmp_path / "one.pt")
    with pytest.raises(DataError, match="must be \\[N, C, H, W\\]"):
        load_data(tmp_path / "one.pt")


def test_a_missing_main_input_names_both_kinds(tmp_path):
    torch.save({"ids": torch.zeros(2, 3, dtype=torch.long)}, tmp_path / "d.pt")
    with pytest.raises(DataError, match="'input_ids' \\(or images \\[N, C, H, W\\] as 'pixel_values'\\)"):
        load_data(tmp_path / "d.pt")
