"""`diagnose check --causal --strict` on the client models' saved files (a state_dict and a factory
file, as their users hold them): a clean model exits 0, the same model with its causal mask removed
exits 1; a causal classifier with no output per position is tested on its residual stream instead
of being skipped; a requested check that cannot run (--causal on a ViT) fails --strict;
x-transformers' cosine attention (qk_norm, scale 10) is no missing 1/sqrt(d_k); minGPT's positions
check runs in float32 (its float64 copy cannot run) and says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from diagnose import check_model
from diagnose.cli.main import cli

from . import mingpt, nanogpt, timm_vit, xtransformers
from .files import save_state_dict

HERE = Path(__file__).parent

FACTORIES = f'''
import importlib.util
import sys


def _client(name):
    spec = importlib.util.spec_from_file_location("_client_" + name, {str(HERE)!r} + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def nanogpt():
    return _client("nanogpt").make(flash=False)


def mingpt():
    return _client("mingpt").make()


def xtransformers():
    return _client("xtransformers").make()


def xtransformers_leaky():
    model = _client("xtransformers").make()
    for m in model.modules():
        if type(m).__name__ == "Attend":
            m.causal = False  # the causal mask removed
    return model


def xtransformers_qk_norm():
    return _client("xtransformers").make(qk_norm=True)


def timm():
    return _client("timm_vit").make()
'''


class Ran:
    """A CLI run: its exit code, and its output with the terminal's line wrapping undone."""

    def __init__(self, res):
        self.exit_code, self.output = res.exit_code, " ".join(res.output.split())


def _check(tmp_path, weights: torch.nn.Module, factory: str, *flags: str) -> Ran:
    (tmp_path / "factories.py").write_text(FACTORIES)
    path = save_state_dict(weights, tmp_path / f"{factory}.pt")
    return Ran(CliRunner().invoke(cli, ["check", str(path), "--factory", f"{tmp_path / 'factories.py'}:{factory}",
                                        *flags]))


def _without_mask(model):
    for block in model.transformer.h:
        block.attn.bias.fill_(1)  # the tril buffer both GPTs mask with, saved in their state_dict
    return model


@pytest.mark.parametrize("client", ["nanogpt", "mingpt"])
def test_gpt_causal_strict_catches_a_removed_mask(client, tmp_path):
    make = {"nanogpt": lambda: nanogpt.make(flash=False), "mingpt": mingpt.make}[client]
    res = _check(tmp_path, make(), client, "--causal", "--strict")
    assert res.exit_code == 0, res.output
    assert "passed: causal, scaling, positions" in res.output
    res = _check(tmp_path, _without_mask(make()), client, "--causal", "--strict")
    assert res.exit_code == 1, res.output
    assert "ERROR causal: Causal leak" in res.output


class LastToken(torch.nn.Module):
    """A causal classifier: x-transformers' output at the last position only, [B, V] (no position axis)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)[:, -1]


@pytest.mark.parametrize("leaky", [False, True])
def test_pooled_outputs_asked_to_be_causal_are_tested_on_the_residual_stream(leaky):
    inner = xtransformers.make()
    for m in inner.modules():
        if type(m).__name__ == "Attend":
            m.causal = not leaky
    result = check_model(LastToken(inner), causal=True, checks=["causal"])
    assert [(f.severity, f.evidence["compared"]) for f in result] == (
        [("error", "the residual stream after inner.attn_layers.layers.3 (the outputs are pooled)")] if leaky else [])
    assert result.passed == ([] if leaky else ["causal"])
    skipped = check_model(LastToken(inner), checks=["causal"])  # nobody asked: nothing per position to test
    assert [s["check"] for s in skipped.skipped] == ["causal"] and list(skipped) == []


def test_xtransformers_causal_strict_catches_a_removed_mask(tmp_path):
    model = xtransformers.make()
    assert _check(tmp_path, model, "xtransformers", "--causal", "--strict").exit_code == 0
    res = _check(tmp_path, model, "xtransformers_leaky", "--causal", "--strict")
    assert res.exit_code == 1, res.output
    assert "ERROR causal: Causal leak" in res.output


def test_cosine_attention_is_not_a_missing_scale(tmp_path):
    res = _check(tmp_path, xtransformers.make(qk_norm=True), "xtransformers_qk_norm", "--causal", "--strict")
    assert res.exit_code == 0, res.output
    assert "INFO scaling: Cosine (qk-normed) attention in 2 of 2 layers" in res.output
    assert "temperature_per_layer = [10, 10]" in res.output


def test_mingpt_positions_run_in_its_own_precision_and_say_so(tmp_path):
    res = _check(tmp_path, mingpt.make(), "mingpt", "--strict")
    assert res.exit_code == 0, res.output
    assert "INFO positions: Ran in the model's own precision, not float64" in res.output
    assert "its float64 copy failed to run (RuntimeError" in res.output
    assert "passed: causal, scaling, positions" in res.output


def test_a_vit_gets_the_checks_that_apply_and_a_requested_causal_check_fails_strict(tmp_path):
    model = timm_vit.make()
    res = _check(tmp_path, model, "timm", "--strict")
    assert res.exit_code == 0, res.output
    assert "passed: scaling, positions" in res.output
    assert "skipped: causal (the input is an image" in res.output
    res = _check(tmp_path, model, "timm", "--causal", "--strict")
    assert res.exit_code == 1, res.output
    assert "WARNING causal: The causal check asked for with --causal (causal=True) could not run" in res.output
