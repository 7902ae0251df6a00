"""The tiny run the hostile-sink tests train, and the run folder as they compare it: five steps of a
2-layer model with a NaN loss at NAN_STEP (a `nonfinite` alert and a saved spike batch) and one
evaluation, with or without sinks; `folder` reads every file back without its wall-clock fields, so
that a run beside a failing sink can be compared with a sink-free one."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from diagnose.monitor import TrainingMonitor
from diagnose.zoo import ModelConfig, Transformer

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11)
NAN_STEP = 3  # a NaN loss here: a `nonfinite` alert (and a spike batch saved)
VOLATILE = ("time", "step_time", "sink_time", "tokens_per_s")  # wall-clock fields: differ between any two runs


def train(run_dir, sinks=(), after_step: Callable[[int], Any] | None = None, **options) -> list[dict]:
    """Five steps and one evaluation; the alerts on_alert saw. after_step(s): called after step s."""
    torch.manual_seed(0)
    model = Transformer(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    seen: list[dict] = []
    with TrainingMonitor(model, run_dir, attention_every=2, echo=False, sinks=list(sinks), save_spikes=True,
                         on_alert=seen.append, **options) as monitor:
        for s in range(5):
            ids = torch.randint(0, CFG.vocab_size, (4, CFG.max_len), generator=gen)  # [B, T]
            loss = F.cross_entropy(model(ids).reshape(-1, CFG.vocab_size), ids.reshape(-1))
            loss.backward()
            monitor.step(torch.tensor(math.nan) if s == NAN_STEP else loss, optimizer=opt, batch={"input_ids": ids})
            opt.step()
            opt.zero_grad()
            if after_step is not None:
                after_step(s)
        monitor.log_eval(4, loss=1.25, accuracy=0.5)
    return seen


def folder(run_dir) -> dict[str, object]:
    """The run folder without its wall-clock fields: every file, every record."""
    out: dict[str, object] = {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(run_dir))
        if name == "run.json":
            info = json.loads(path.read_text())
            out[name] = {k: v for k, v in info.items() if k not in ("started", "ended", "sessions")}
        elif path.suffix == ".json":  # a spike's record
            out[name] = json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            lines = [json.loads(x) for x in path.read_text().splitlines()]
            out[name] = [{k: v for k, v in r.items() if k not in VOLATILE} if isinstance(r, dict) else r
                         for r in lines]
        else:
            out[name] = path.read_bytes()
    return out


def dropped(caught) -> list[str]:
    """The messages of the guest warnings among `caught` (warnings.catch_warnings(record=True))."""
    return [str(w.message) for w in caught if "diagnose: sink" in str(w.message)
            or "diagnose: Lightning logger" in str(w.message)]
