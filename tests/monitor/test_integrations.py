"""The Lightning callback and the Hugging Face TrainerCallback on tiny runs."""

from __future__ import annotations

import pytest
import torch

from diagnose.monitor import read_run
from ..tolerance import approx
from .lightning_lm import tiny_lm

pytestmark = pytest.mark.numerics


def _no_hooks(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.slow
def test_lightning_callback(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.lightning import DiagnoseCallback

    Module = tiny_lm(L)
    ids = torch.randint(1, 11, (20, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    cb_run = tmp_path / "diag"
    module2 = Module()
    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", gradient_clip_val=0.01,
                        default_root_dir=str(tmp_path), callbacks=[DiagnoseCallback(cb_run, every=1, echo=False)])
    trainer.fit(module2, loader)
    run = read_run(cb_run)
    assert run.steps["step"].tolist() == [0, 1, 2, 3, 4] and run.closed
    assert run.info["model"]["blocks"] == ["net.blocks.0", "net.blocks.1"]
    # norms are read before Lightning clips to 0.01: far above it, with a matching clip coefficient
    assert (run.steps["grad_norm"] > 0.05).all()
    assert run.steps["clip_coef"].tolist() == approx((0.01 / (run.steps["grad_norm"] + 1e-6)).tolist())  # float32 norm
    assert run.steps["loss"].notna().all() and _no_hooks(module2)


@pytest.mark.slow
def test_hf_trainer_callback(tmp_path):
    transformers = pytest.importorskip("transformers")
    from diagnose.monitor.hf import DiagnoseHFCallback

    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=11, n_positions=8)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 11, (16, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
                                          report_to=[], save_strategy="no", logging_strategy="no",
                                          max_grad_norm=0.0, use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[DiagnoseHFCallback(tmp_path / "diag", attention_every=2, every=1, echo=False)])
    trainer.train()
    run = read_run(tmp_path / "diag")
    assert run.steps["step"].tolist() == [1, 2, 3, 4] and run.closed  # the Trainer's own step numbers
    assert run.info["settings"]["grad_norm_post_clip"] is False and run.info["clip"] is None
    assert run.steps["loss"].between(0.5, 10).all()
    assert len(run.info["model"]["blocks"]) == 2 and (run.steps["grad_norm"] > 0).all()
    assert sorted(run.attention["step"].unique()) == [2, 4] and len(run.attention) == 2 * 2 * 2  # steps x sites x heads
    assert _no_hooks(model)
