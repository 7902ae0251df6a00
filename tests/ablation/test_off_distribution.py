"""Ground truth for off-distribution ablation (issue 23): a head whose output is a large constant that
the rest of the model expects. Zero ablation removes the constant and pushes the residual stream where
the model never was, so it calls the head vital; mean and resample ablation put the same constant back,
so they call it negligible; and `diagnose heads --methods zero,mean,resample` says, on saved files, that
this head's verdict depends on the method, in the table, the JSON and the report."""

from __future__ import annotations

import html
import json
import re

import torch
from click.testing import CliRunner

import diagnose
from diagnose.zoo import ModelConfig, Transformer

V, T, N, D_MODEL, HEAD_DIM = 8, 8, 48, 16, 8
BIG = 20.0  # the constant: far larger than the embeddings (std 0.2), so 0 is far off-distribution


def constant_head_model() -> torch.nn.Module:
    """One layer, two heads; head L0.H0's values are the constant BIG on its first coordinate, written by the
    output projection to residual coordinate 0, where every token embedding holds -BIG: the clean residual
    is as if neither were there. The unembedding reads coordinate 0 strongly, so losing the constant hurts."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="lm", vocab_size=V, max_len=T, n_layers=1, n_heads=2, d_model=D_MODEL,
                                    init_std=0.2)).eval()
    attn, width = model.blocks[0].attn, 2 * HEAD_DIM
    with torch.no_grad():
        v = slice(2 * width, 2 * width + HEAD_DIM)  # head 0's value rows in the fused qkv
        attn.qkv.weight[v] = 0.0
        attn.qkv.bias[v] = 0.0
        attn.qkv.bias[2 * width] = BIG  # every value of head 0 is (BIG, 0, ...): so is its output
        attn.proj.weight[:, :HEAD_DIM] = 0.0
        attn.proj.weight[0, :] = 0.0  # coordinate 0 is written by head 0's first coordinate only
        attn.proj.weight[0, 0] = 1.0
        attn.proj.bias[0] = 0.0
        model.tok_emb.weight[:, 0] = -BIG
        model.pos_emb.weight[:, 0] = 0.0
        model.blocks[0].mlp.proj.weight[0] = 0.0
        model.blocks[0].mlp.proj.bias[0] = 0.0
        model.head.weight[:, 0] = 3.0 * torch.randn(V)
    return model


def _data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[::3, 6:] = 0  # [N, T], some examples padded
    return {"input_ids": torch.randint(1, V, (N, T), generator=g) * mask, "attention_mask": mask}


def test_zero_calls_the_constant_head_vital_mean_and_resample_negligible_and_the_report_says_so(tmp_path):
    from diagnose.cli.main import cli

    diagnose.save_checkpoint(constant_head_model(), tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save(_data(), tmp_path / "data.pt")
    run = CliRunner().invoke(cli, ["heads", str(tmp_path / "lm.pt"), "--data", str(tmp_path / "data.pt"),
                                   "--methods", "zero,mean,resample", "--draws", "3", "--json",
                                   str(tmp_path / "heads.json"), "--html", str(tmp_path / "heads.html")])
    assert run.exit_code == 0, run.output
    doc = json.loads((tmp_path / "heads.json").read_text())
    assert doc["method"] == "zero" and doc["agreement"]["methods"] == ["zero", "mean", "resample"]
    row = next(r for r in doc["agreement"]["heads"] if (r["layer"], r["head"]) == (0, 0))
    assert row["verdicts"]["zero"] == "matters" and row["agree"] is False
    for method in ("mean", "resample"):  # the constant is put back: any change is rounding, inside the band
        assert row["verdicts"][method] in ("negligible", "detectable but negligible"), row
    band = doc["significance"]["negligible_band"]["loss"]
    assert row["delta_loss"]["zero"] > 10 * band and row["delta_loss_ci"]["zero"][0] > band
    for method in ("mean", "resample"):
        assert max(map(abs, row["delta_loss_ci"][method])) < band
    assert [0, 0] in doc["agreement"]["depends"]
    assert next(h for h in doc["heads"] if (h["layer"], h["head"]) == (0, 0))["verdict"] == "matters"
    out = " ".join(run.output.split())
    assert "the verdict depends on the method for L0.H0 (zero: matters, mean: " in out
    page = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "heads.html").read_text())).split())
    assert "Depends on the method" in page and "L0.H0 (zero: matters, mean: " in page
