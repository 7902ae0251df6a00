"""Workers for the distributed tests: each joins a gloo group over a file store, runs ablate_heads
on its rank and writes what it returned (or the error it raised) for the parent to compare."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from diagnose.zoo import ModelConfig, Transformer

V, T, N, H, D = 20, 7, 10, 4, 8
SETTINGS = {  # name -> ablate_heads keywords; batch 3 cuts 10 examples into 3 + 3 | 3 + 1
    "exact": dict(task="lm", batch_size=3, together=[[(0, 1), (1, 2)]]),
    "mean_fast": dict(task="lm", batch_size=3, method="mean", fast=True, top=3),
    # donors picked over the whole data set and recorded on the rank that holds them, then gathered
    "resample": dict(task="lm", batch_size=3, method="resample", draws=3, seed=5, together=[[(0, 1), (1, 2)]]),
    "resample_fast": dict(task="lm", batch_size=3, method="resample", seed=2, fast=True, top=3),
    # one batch for two ranks: rank 1 holds none and takes the donors rank 0 recorded (as mean's data pass), and
    # joins the direct passes and the attention summary all the same (its direct passes crashed on parts[0])
    "resample_one_batch": dict(task="lm", batch_size=N, method="resample", seed=1),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=V, max_len=16, n_layers=2, n_heads=H, d_model=H * D,
                                   init_std=0.2)).eval()


def data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[::2, 5:] = 0  # [N, T], padding on every other example
    return {"input_ids": torch.randint(1, V, (N, T), generator=g) * mask, "attention_mask": mask}


class FailsOnLastExample(torch.nn.Module):
    """The model, except that a batch holding the last example (only rank 1 has it) raises."""

    def __init__(self, inner: torch.nn.Module, bad: torch.Tensor):
        super().__init__()
        self.inner, self.bad = inner, bad

    def forward(self, input_ids, attention_mask=None):
        if any(torch.equal(row, self.bad) for row in input_ids):
            raise RuntimeError("out of memory on this rank")
        return self.inner(input_ids, attention_mask=attention_mask)


def worker(rank: int, world: int, store: str, out_dir: str, threads: int) -> None:
    """One rank: every setting, then the failing model (which must raise on every rank, not hang)."""
    from diagnose.ablation import ablate_heads

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        for name, kw in SETTINGS.items():
            result = ablate_heads(model(), data(), progress=False, **kw)
            with open(os.path.join(out_dir, f"{name}.{rank}.json"), "w") as f:
                json.dump(result.to_json(), f)
        d = data()
        try:
            ablate_heads(FailsOnLastExample(model(), d["input_ids"][-1]), d, task="lm", batch_size=3,
                         progress=False, attention=False)
            error = None
        except Exception as exc:  # noqa: BLE001 -- the parent checks which error each rank saw
            error = f"{type(exc).__name__}: {exc}"
        with open(os.path.join(out_dir, f"error.{rank}.json"), "w") as f:
            json.dump(error, f)
    finally:
        dist.destroy_process_group()
