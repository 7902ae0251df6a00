"""`diagnose demo`: train the reference model on the synthetic tasks and save everything a
user needs to try the other commands (checkpoint + evaluation data per task) under one folder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .io.checkpoint import save_checkpoint
from .io.data import save_tensors
from .zoo import ModelConfig, TrainConfig, Transformer, induction, order, padded_majority, train


@dataclass
class DemoModel:
    name: str
    task: str
    checkpoint: Path
    data: Path
    accuracy: float
    loss: float
    seconds: float


@dataclass
class DemoResult:
    out_dir: Path
    models: list[DemoModel] = field(default_factory=list)


def demo_specs():
    """(name, data, model config, train config) for each demo model."""
    return [
        ("induction", induction(n=4096, half=10, vocab_size=24),
         ModelConfig(kind="lm", vocab_size=24, max_len=32, n_layers=2, n_heads=4, d_model=64),
         TrainConfig(steps=600, lr=3e-3, batch_size=64, warmup=50)),
        ("order", order(n=4096, length=8, vocab_size=16),
         ModelConfig(kind="classifier", vocab_size=16, max_len=8, n_layers=2, n_heads=4, d_model=64),
         TrainConfig(steps=400, lr=3e-3, batch_size=64, warmup=50)),
        ("padding", padded_majority(n=4096, max_len=16, vocab_size=8),
         ModelConfig(kind="classifier", vocab_size=8, max_len=16, n_layers=2, n_heads=4, d_model=64),
         TrainConfig(steps=400, lr=3e-3, batch_size=64, warmup=50)),
    ]


def run_demo(out_dir: str | Path = "demo-out", *, log: Callable[[str], None] = print) -> DemoResult:
    """Train each demo model, evaluate it on held-out data, and save both under out_dir/<task>/."""
    out = Path(out_dir)
    result = DemoResult(out)
    for name, data, mcfg, tcfg in demo_specs():
        train_data, eval_data = data.split(len(data) - 512)
        torch.manual_seed(tcfg.seed)
        model = Transformer(mcfg)
        start = time.perf_counter()
        res = train(model, train_data, tcfg, eval_data=eval_data)
        folder = out / name
        ckpt = save_checkpoint(model, folder / "model.pt", meta={"task": data.task, "dataset": name,
                                                                 "description": data.description})
        data_file = save_tensors(eval_data.tensors(), folder / "eval.pt")
        item = DemoModel(name, data.task, ckpt, data_file, res.eval_accuracy, res.eval_loss,
                         time.perf_counter() - start)
        result.models.append(item)
        log(f"{name:10s} accuracy {item.accuracy:.3f}  loss {item.loss:.3f}  ({item.seconds:.0f} s)  "
            f"-> {ckpt}, {data_file}")
    return result
