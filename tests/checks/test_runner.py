"""check_model: clean models pass everything, the model is left untouched, the JSON is versioned."""

from __future__ import annotations

import json

import pytest
import torch

from diagnose import check_model
from diagnose.checks import Findings
from diagnose.errors import ConfigError, DataError, DiagnoseError
from diagnose.io import DataSet
from diagnose.zoo import ModelConfig, Transformer, padded_majority

from ..hooks import hook_snapshot
from ..nano import NanoGPT

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("cfg", [dict(kind="lm"), dict(kind="classifier"),
                                 dict(kind="lm", positions="rotary", norm="post"),
                                 dict(kind="classifier", positions="sinusoidal", pooling="first")])
def test_correct_reference_models_raise_no_finding(cfg):
    result = check_model(Transformer(ModelConfig(**cfg)))
    assert result.problems == []
    assert set(result.passed) | {s["check"] for s in result.skipped} == {"causal", "padding", "scaling", "positions"}


def test_every_broken_switch_is_found_at_once():
    model = Transformer(ModelConfig(kind="lm", causal=False, mask_fill="zero", attn_scale="none", positions="none"))
    result = check_model(model, causal=True)
    assert sorted(f.check for f in result.problems) == ["causal", "padding", "positions", "scaling"]
    assert result.passed == []


def test_model_is_left_untouched():
    model = NanoGPT(mask_offset=2).train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = hook_snapshot(model)
    check_model(model, causal=True)
    assert model.training and hook_snapshot(model) == hooks
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_json_is_versioned_and_round_trips(tmp_path):
    result = check_model(Transformer(ModelConfig(kind="classifier", mask_fill="zero")))
    data = json.loads(result.write_json(tmp_path / "c.json").read_text())
    assert data["schema"] == "diagnose.checks/1" and data["model"]["family"] == "Transformer"
    assert [f["check"] for f in data["findings"]] == ["padding"]
    f = data["findings"][0]
    assert set(f) == {"check", "severity", "title", "evidence", "fix"} and f["severity"] == "error"
    assert all(isinstance(v, (int, float, list, bool)) or v is None for v in f["evidence"].values())
    assert data["passed"] == ["scaling", "positions"] and data["skipped"][0]["check"] == "causal"
    again = Findings.from_json(data)
    assert again.to_json() == data


def test_data_in_every_form_gives_the_same_probe():
    task = padded_majority(n=64, max_len=12, min_len=8)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=8))
    forms = [task, task.tensors(), DataSet(task.input_ids, task.attention_mask, task.labels)]
    shapes = {check_model(model, d, checks=["positions"]).model["probe"]["length"] for d in forms}
    eighth_longest = int(task.attention_mask.sum(1).sort(descending=True).values[7])
    assert shapes == {eighth_longest}  # the longest 8 rows, cut to their shortest real length
    short = {"input_ids": task.input_ids[:3], "attention_mask": task.attention_mask[:3]}
    assert check_model(model, short, checks=["positions"]).model["probe"] == \
        {"examples": 3, "length": int(task.attention_mask[:3].sum(1).min()), "data": "given"}
    ids = torch.randint(1, 8, (4, 10))
    assert check_model(model, ids, checks=["positions"]).model["probe"]["length"] == 10


def test_bad_inputs_raise_diagnose_errors():
    model = Transformer(ModelConfig())
    with pytest.raises(ConfigError, match="unknown check"):
        check_model(model, checks=["nope"])
    with pytest.raises(DataError, match="vocabulary"):
        check_model(model, torch.full((2, 8), 99))
    with pytest.raises(DataError, match="at least 4"):
        check_model(model, {"input_ids": torch.ones(2, 8, dtype=torch.long),
                            "attention_mask": torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0]] * 2)})
    with pytest.raises(DataError, match="integer"):
        check_model(model, torch.rand(2, 8))


def test_model_that_fails_on_the_probe_is_one_clear_error():
    class Picky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, ids):
            raise RuntimeError("wants images")

    with pytest.raises(DiagnoseError, match="Picky failed on probe input_ids .*wants images"):
        check_model(Picky())


@pytest.mark.parametrize("causal", [False, True])
def test_torch_transformer_encoder_passes(causal):
    from ..nano import TorchEncoderLM

    model = TorchEncoderLM(causal=causal)
    model.is_causal = causal  # declared: without it an LM-shaped encoder's leak is a warning
    result = check_model(model, causal=True if causal else None)
    assert result.problems == [] and result.passed == ["causal", "padding", "scaling", "positions"]
    assert [f.severity for f in result] == ([] if causal else ["info"])  # an encoder sees the future
