"""The callbacks log what the trainers themselves log: the optimizer step's loss (all micro-batches),
the PRE-clip gradient norm, and the same step numbers, under gradient accumulation, clipping and
bf16 autocast. The reference is each trainer's own log (HF: log_history with logging_steps=1;
Lightning: the module's self.log of its loss and of lightning's grad_norm utility)."""

from __future__ import annotations

import pytest
import torch

from diagnose.monitor import read_run
from ..tolerance import tol
from .lightning_lm import tiny_lm

pytestmark = pytest.mark.numerics


def _close(a, b) -> bool:
    """The same step's number computed by the trainer and by the monitor: float32 sums over the
    tiny models' parameters and tokens (a few thousand terms), judged by the tolerance policy."""
    return abs(a - b) <= tol(max(abs(a), abs(b)), depth=2, width=WIDTH)


WIDTH = 10_000  # the longest sum: the squared gradients of every parameter of these models (< 10^4)


HF_CASES = [(1, 0.0, False), (4, 0.05, False), (4, 0.0, True), (1, 0.05, True)]


@pytest.mark.slow
@pytest.mark.parametrize("accum,clip,bf16", HF_CASES)
def test_hf_matches_trainer_log(tmp_path, accum, clip, bf16):
    transformers = pytest.importorskip("transformers")
    from diagnose.monitor.hf import DiagnoseHFCallback

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=23, n_positions=12)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (48, 12), generator=g)  # [N, T]
    mask = torch.ones_like(ids)
    mask[::3, 9:] = 0  # some padding: the token-weighted loss differs from a plain mean
    labels = ids.masked_fill(mask == 0, -100)
    data = [{"input_ids": x, "attention_mask": m, "labels": y} for x, m, y in zip(ids, mask, labels)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=3,
        gradient_accumulation_steps=accum, learning_rate=0.05, report_to=[], save_strategy="no",
        logging_strategy="steps", logging_steps=1, max_grad_norm=clip, use_cpu=True, bf16=bf16,
        disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[DiagnoseHFCallback(tmp_path / "diag", every=1, echo=False)])
    trainer.train()
    # transformers 5.0 logs no grad_norm when it does not clip (max_grad_norm=0; 5.24 does): then
    # only the loss and the steps have a reference
    theirs = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    run = read_run(tmp_path / "diag")
    ours = run.steps
    assert ours["step"].tolist() == [h["step"] for h in theirs] == [1, 2, 3, 4]
    for (_, row), h in zip(ours.iterrows(), theirs):
        assert _close(row["loss"], h["loss"]), (row["loss"], h["loss"])
        assert row["micro_batches"] == accum
        assert 3 * accum * 9 <= row["tokens"] <= 3 * accum * 12  # the attention mask's sum: padded rows count 9
    # where the trainer logged a norm (always when it clips), ours matches it
    norms = [(row["grad_norm"], h["grad_norm"]) for (_, row), h in zip(ours.iterrows(), theirs) if "grad_norm" in h]
    assert len(norms) == 4 or not clip
    assert [(a, b) for a, b in norms if not _close(a, b)] == []
    # with clipping the coefficient is the trainer's, clipping really happened, and the norm is above it
    coefs = [(row["clip_coef"], min(1.0, clip / (h["grad_norm"] + 1e-6))) for (_, row), h in
             zip(ours.iterrows(), theirs) if clip]
    assert [(a, b) for a, b in coefs if not _close(a, b)] == []
    assert run.info["clip"] == (clip or None)
    assert (ours["grad_norm"] > (clip or -1.0)).all()


@pytest.mark.slow
@pytest.mark.parametrize("accum,clip,bf16", [(1, None, False), (4, 0.05, False), (4, None, True), (1, 0.05, True)])
def test_lightning_matches_trainer_log(tmp_path, accum, clip, bf16):
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.utilities import grad_norm

    from diagnose.monitor.lightning import DiagnoseCallback

    class Module(tiny_lm(L)):
        def __init__(self):
            super().__init__()
            self.losses, self.norms = [], []  # per micro-batch, per optimizer step

        def training_step(self, batch, _):
            loss = self.lm_loss(batch[0])
            self.losses.append((self.global_step, loss.item()))
            return loss

        def on_before_optimizer_step(self, optimizer):
            self.norms.append((self.global_step, grad_norm(self, norm_type=2)["grad_2.0_norm_total"].item()))

    torch.manual_seed(0)
    ids = torch.randint(1, 11, (64, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    module = Module()
    trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", gradient_clip_val=clip,
                        accumulate_grad_batches=accum, precision="bf16-mixed" if bf16 else "32-true",
                        default_root_dir=str(tmp_path), callbacks=[DiagnoseCallback(tmp_path / "diag", every=1, echo=False)])
    trainer.fit(module, loader)
    run = read_run(tmp_path / "diag")
    steps = sorted({s for s, _ in module.norms})
    assert run.steps["step"].tolist() == steps == [0, 1, 2, 3]
    for (_, row), (s, norm) in zip(run.steps.iterrows(), module.norms):
        micro = [v for t, v in module.losses if t == s]
        assert len(micro) == accum == row["micro_batches"]
        assert _close(row["loss"], sum(micro) / len(micro)), (row["loss"], micro)
        assert _close(row["grad_norm"], norm), (row["grad_norm"], norm)
        assert row["tokens"] == 4 * 8 * accum
    assert run.info["clip"] == clip
    assert (run.steps["grad_norm"] > (clip or -1.0)).all()  # with clipping: clipping really happened
