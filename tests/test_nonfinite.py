"""A model with NaN weights stops every analysis with one line naming the cause (exit 2 at the
CLI), instead of reporting NaN losses, an accuracy, p-values or a passed causal check."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.ablation import ablate_heads
from diagnose.cli.main import cli
from diagnose.errors import DiagnoseError, NonFiniteError
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


def _nan_model(kind="lm"):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind=kind, vocab_size=12, n_classes=3, max_len=8, n_layers=2, n_heads=2,
                                    d_model=16))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def _ids():
    return torch.randint(1, 12, (6, 8), generator=torch.Generator().manual_seed(0))  # [N, T]


def test_library_raises_a_diagnose_error_naming_the_weights():
    model = _nan_model()
    assert issubclass(NonFiniteError, DiagnoseError)
    with pytest.raises(NonFiniteError, match="weight tensor.*NaN"):
        diagnose.check_model(model)
    with pytest.raises(NonFiniteError, match="tok_emb"):
        diagnose.capture(model, _ids())
    with pytest.raises(NonFiniteError, match="before any head is ablated"):
        ablate_heads(model, {"input_ids": _ids()}, task="lm", progress=False)


def test_finite_weights_that_overflow_name_the_forward():
    model = _nan_model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.01)
        model.tok_emb.weight.fill_(3e38)  # finite, but the sum with positions overflows to inf
    with pytest.raises(NonFiniteError, match="weights are finite"):
        diagnose.capture(model, _ids())


@pytest.mark.parametrize("command", ["heads", "check"])
def test_cli_stops_with_one_line_and_exit_2(tmp_path, command):
    diagnose.save_checkpoint(_nan_model(), tmp_path / "nan.pt", meta={"task": "lm"})
    torch.save({"input_ids": _ids()}, tmp_path / "data.pt")
    args = [command, str(tmp_path / "nan.pt"), "--data", str(tmp_path / "data.pt")]
    if command == "heads":
        args += ["--json", str(tmp_path / "heads.json")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "non-finite outputs" in lines[0], res.stderr
    assert "Traceback" not in res.output and not (tmp_path / "heads.json").exists()
