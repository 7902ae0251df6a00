"""`diagnose stats` says which signals a run lacks and why (issue 33): a classifier has no output
logits over a vocabulary (no log-partition z), SGD keeps no Adam second moment; a language model
trained with Adam lacks nothing."""

from __future__ import annotations

import pytest
import json

import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.monitor import TrainingMonitor
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


def _train(run_dir, kind: str, optimizer) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind=kind, n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    opt = optimizer(model.parameters())
    ids = torch.randint(1, 11, (4, 8))  # [B, T]
    with TrainingMonitor(model, run_dir, every=1, attention_every=1, echo=False) as mon:
        for _ in range(3):
            out = model(ids)
            loss = (F.cross_entropy(out[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1)) if kind == "lm"
                    else F.cross_entropy(out, ids[:, 0] % out.shape[-1]))
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()


def test_stats_names_the_signals_a_classifier_trained_with_sgd_lacks(tmp_path):
    _train(tmp_path / "cls", "classifier", lambda p: torch.optim.SGD(p, lr=0.1))
    result = CliRunner().invoke(cli, ["stats", str(tmp_path / "cls")], env={"COLUMNS": "240"})  # xdist workers set COLUMNS=80
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("not recorded:")]
    assert len(lines) == 3, result.output
    icl = next(ln for ln in lines if "icl_score" in ln)
    assert "classifier" in icl and "in-context score" in icl
    z, adam = sorted((ln for ln in lines if ln != icl), key=lambda ln: "z_mean" not in ln)
    assert "z_mean" in z and "logit_divergence cannot fire" in z and "classifier" in z
    assert "adam_rms_v_eps" in adam and "update_ratio" not in adam and "Adam second moment" in adam
    js = json.loads(CliRunner().invoke(cli, ["stats", str(tmp_path / "cls"), "--json"]).output)
    assert {x["measurement"] for x in js["lacking_signals"]} == {"logit_z", "optimizer", "icl"}


def test_stats_of_a_language_model_trained_with_adam_lacks_nothing(tmp_path):
    _train(tmp_path / "lm", "lm", lambda p: torch.optim.AdamW(p, lr=1e-3))
    result = CliRunner().invoke(cli, ["stats", str(tmp_path / "lm")], env={"COLUMNS": "240"})  # xdist workers set COLUMNS=80
    assert result.exit_code == 0, result.output
    assert "not recorded:" not in result.output
    js = json.loads(CliRunner().invoke(cli, ["stats", str(tmp_path / "lm"), "--json"]).output)
    assert js["lacking_signals"] == []


def test_run_json_lists_each_sites_signals_and_stats_names_a_site_without_one(tmp_path):
    _train(tmp_path / "lm", "lm", lambda p: torch.optim.AdamW(p, lr=1e-3))
    info = json.loads((tmp_path / "lm" / "run.json").read_text())
    sites = info["model"]["attention_sites"]
    assert set(info["signals"]["attention"]) == set(sites)  # the reference model hands its scores over
    for site in sites:
        assert {"entropy", "max_weight", "max_logit"} <= set(info["signals"]["attention"][site])
    assert {"loss", "grad_norm", "z_mean"} <= set(info["signals"]["model"])
    # one site as an adapter that hands over probabilities only would leave it: named, with the reason
    info["signals"]["attention"][sites[1]].remove("max_logit")
    (tmp_path / "lm" / "run.json").write_text(json.dumps(info))
    js = json.loads(CliRunner().invoke(cli, ["stats", str(tmp_path / "lm"), "--json"]).output)
    assert [x["keys"] for x in js["lacking_signals"]] == [[f"attention.{sites[1]}.max_logit"]]
    assert "attention_logit_growth cannot fire" in js["lacking_signals"][0]["reason"]
    # the same run as if compiled on a torch whose dynamo cannot trace the hand-over
    info["model"].update(compiled=True, torch="2.4.1")
    (tmp_path / "lm" / "run.json").write_text(json.dumps(info))
    js = json.loads(CliRunner().invoke(cli, ["stats", str(tmp_path / "lm"), "--json"]).output)
    assert "torch.compile on torch 2.4.1" in js["lacking_signals"][0]["reason"]
