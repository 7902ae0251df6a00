"""The callbacks forward the trainers' evaluations to evals.jsonl, stop the trainer on chosen
alert kinds (stop_on), and save the batch behind a spike alert (save_spikes)."""

from __future__ import annotations

import pytest
import torch

from diagnose.monitor import read_run, read_skips

from ..tolerance import approx
from .lightning_lm import tiny_lm

pytestmark = pytest.mark.numerics


def _hf(tmp_path, poison=False, accum=1, **cb):
    transformers = pytest.importorskip("transformers")
    from diagnose.monitor.hf import DiagnoseHFCallback

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=23,
                                                                 n_positions=12))
    if poison:
        with torch.no_grad():
            model.transformer.wte.weight.fill_(float("nan"))
    ids = torch.randint(0, 23, (24, 12), generator=torch.Generator().manual_seed(1))  # [N, T]
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=accum, eval_strategy="steps", eval_steps=2, report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8],
                                   callbacks=[DiagnoseHFCallback(tmp_path / "diag", every=1, echo=False, **cb)])
    trainer.train()
    return trainer, read_run(tmp_path / "diag")


@pytest.mark.slow
def test_hf_forwards_evaluations(tmp_path):
    trainer, run = _hf(tmp_path)
    theirs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert run.evals["step"].tolist() == [h["step"] for h in theirs] == [2, 4]
    assert run.evals["loss"].tolist() == [h["eval_loss"] for h in theirs]  # the trainer's own numbers, passed on
    assert "runtime" in run.evals.columns  # the other eval_* metrics, without their prefix


@pytest.mark.slow
def test_hf_stops_on_nonfinite_and_saves_the_batch(tmp_path):
    trainer, run = _hf(tmp_path, poison=True, accum=2, stop_on=("nonfinite",), save_spikes=True)
    assert trainer.state.global_step == 1 and run.steps["step"].tolist() == [1]
    (spike,) = run.spikes
    assert spike["step"] == 1 and "nonfinite" in spike["kinds"]
    # the two micro-batches joined, with one loss per example (NaN here: the embeddings are NaN)
    assert spike["tensors"]["input_ids"]["shape"] == [8, 12] and spike["tensors"]["labels"]["shape"] == [8, 12]
    assert spike["tensors"]["per_example_loss"]["shape"] == [8]
    assert read_skips(tmp_path / "diag") == [{"step": 1, "kinds": ["nonfinite"], "action": "stopped",
                                              "batch": "step_00000001"}]  # the batch to leave out on resuming


def test_hf_per_example_loss_agrees_with_the_models_loss():
    transformers = pytest.importorskip("transformers")
    from diagnose.monitor.hf import _per_example

    torch.manual_seed(0)
    for model in (transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16,
                                                                        vocab_size=23, n_positions=12)),
                  transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=23, hidden_size=16,
                                                                       num_hidden_layers=1, num_attention_heads=2,
                                                                       intermediate_size=32))):
        shift = {"ForCausalLMLoss": 1, "ForMaskedLMLoss": 0}[model.loss_function.__name__]
        ids = torch.randint(0, 23, (5, 10), generator=torch.Generator().manual_seed(2))  # [B, T]
        labels = ids.clone()
        labels[1, 4:] = -100  # fewer counted tokens in one example
        labels[3, ::2] = -100
        out = model(input_ids=ids, labels=labels)
        per = _per_example(out.logits, labels, shift)  # [B]
        counted = (labels[:, 1:] if shift else labels).ne(-100).sum(1)  # tokens each example's loss averages
        # the same logits, the token losses summed per example then pooled vs summed at once:
        # float32 sums of up to counted.sum() token losses of size about the largest example mean
        assert float((per * counted).sum() / counted.sum()) == approx(out.loss.item(), scale=float(per.max()),
                                                                      width=int(counted.sum()))


@pytest.mark.slow
def test_lightning_forwards_validation_and_stops(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.lightning import DiagnoseCallback

    class Module(tiny_lm(L)):
        def __init__(self, nan_at=None):
            super().__init__()
            self.nan_at, self.val = nan_at, []

        def training_step(self, batch, _):
            loss = self.lm_loss(batch[0])
            self.log("train_loss", loss)  # a training metric: not an evaluation
            return loss * float("nan") if self.global_step == self.nan_at else loss

        def validation_step(self, batch, _):
            loss = self.lm_loss(batch[0])
            self.log("val_loss", loss)
            self.log("val_acc", torch.tensor(0.5))
            return loss

        def on_validation_epoch_end(self):
            if not self.trainer.sanity_checking:
                self.val.append((self.global_step, self.trainer.callback_metrics["val_loss"].item()))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    ids = torch.randint(1, 11, (32, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              accelerator="cpu", default_root_dir=str(tmp_path), val_check_interval=2, limit_val_batches=2)
    module = Module()
    L.Trainer(max_steps=4, callbacks=[DiagnoseCallback(tmp_path / "a", every=1, echo=False)], **kw).fit(module, loader, loader)
    ev = read_run(tmp_path / "a").evals
    assert ev["step"].tolist() == [s for s, _ in module.val] == [2, 4]
    assert ev["loss"].tolist() == [v for _, v in module.val] and ev["val_acc"].tolist() == [0.5, 0.5]  # passed on
    assert "train_loss" not in ev.columns

    module = Module(nan_at=1)
    trainer = L.Trainer(max_steps=6, callbacks=[DiagnoseCallback(tmp_path / "b", every=1, echo=False, stop_on="nonfinite")],
                        **kw)
    trainer.fit(module, loader, loader)
    run = read_run(tmp_path / "b")
    assert run.steps["step"].tolist() == [0, 1] and trainer.global_step == 2  # stopped after the bad step
    assert [a["kind"] for a in run.alerts if a["kind"] == "nonfinite"] == ["nonfinite"]
    assert [(e["step"], e["action"]) for e in read_skips(tmp_path / "b")] == [(1, "stopped")]


@pytest.mark.slow
def test_lightning_skips_the_update_of_a_planted_spike(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.lightning import DiagnoseCallback

    class Module(tiny_lm(L, torch.optim.Adam, lr=1e-3)):
        def training_step(self, batch, _):
            loss = self.lm_loss(batch[0])
            return loss * (30.0 if self.global_step == 12 else 1.0)  # the planted spike, on a step not logged

    torch.manual_seed(0)
    module = Module()
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(0)).repeat(4, 1)  # one batch, 4x
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    trainer = L.Trainer(max_steps=14, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path),
                        callbacks=[DiagnoseCallback(tmp_path / "s", echo=False, skip_on=("loss_spike",))])
    trainer.fit(module, loader)
    assert [(e["step"], e["action"]) for e in read_skips(tmp_path / "s")] == [(12, "skipped")]
    opt = trainer.optimizers[0]
    # Adam counted 13 updates in 14 steps: the skipped one left its state alone
    assert {int(opt.state[p]["step"]) for p in module.parameters()} == {13}


@pytest.mark.slow
def test_hf_raise_on_propagates_and_closes_the_run(tmp_path):
    from diagnose.errors import TrainingAlertError

    with pytest.raises(TrainingAlertError, match="nonfinite"):
        _hf(tmp_path, poison=True, raise_on=("nonfinite",))
    run = read_run(tmp_path / "diag")
    assert run.closed and run.steps["step"].tolist() == [1]
