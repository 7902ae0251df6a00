"""Step-time overhead of TrainingMonitor (every step logged) on the reference model's training
loop, against the same loop unmonitored and the same loop under wandb.watch(log="all",
log_freq=1) in offline mode. Goals: diagnose <= 5 % overhead, and <= 1/5 of wandb's.

Three identical models, one per variant; repetitions are interleaved (plain, diagnose,
wandb, plain, ...) so that load on the machine hits all three alike; each variant's time is
divided by the plain loop's time in the same repetition, and the median ratio is reported,
for wall-clock and for this process's CPU time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_monitor.py [--reps 15] [--steps 10] [--d-model 128] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

from diagnose.monitor import TrainingMonitor  # noqa: E402
from diagnose.objectives import score  # noqa: E402
from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, make_optimizer  # noqa: E402

MODEL = dict(n_layers=4, n_heads=4, d_model=128, max_len=32)


def make(seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**MODEL))  # MODEL may be changed by --d-model / --layers
    opt, sched = make_optimizer(model, TrainConfig(steps=10_000, warmup=50))
    return model, opt, sched


def run_steps(model, opt, sched, data, gen, n, on_backward=None, after_step=None) -> tuple[float, float]:
    """(wall, CPU) seconds per step over n steps of the zoo training loop (batch 32, clip 1.0)."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        idx = torch.randint(0, len(data), (32,), generator=gen)
        logits = model(data.input_ids[idx], attention_mask=data.attention_mask[idx])  # [B, T, V]
        loss = score(logits, data.labels[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if on_backward is not None:
            on_backward(loss, opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if after_step is not None:
            after_step(loss)
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=MODEL["d_model"])
    ap.add_argument("--layers", type=int, default=MODEL["n_layers"])
    args = ap.parse_args()
    MODEL.update(d_model=args.d_model, n_layers=args.layers)
    torch.set_num_threads(1)
    data = induction(n=2048, length=24, vocab_size=32)
    tmp = tempfile.mkdtemp(prefix="bench_monitor_")
    os.environ["WANDB_DIR"] = tmp

    plain = make()
    diag = make()
    mon = TrainingMonitor(diag[0], os.path.join(tmp, "run"), every=1, attention_every=50, clip=1.0, echo=False)
    variants = {
        "plain": (plain, {}),
        "diagnose": (diag, {"on_backward": lambda loss, opt: mon.step(loss, optimizer=opt)}),
    }
    try:
        import wandb

        wb = make()
        wrun = wandb.init(project="diagnose-bench", dir=tmp, mode="offline")
        wandb.watch(wb[0], log="all", log_freq=1)
        variants["wandb"] = (wb, {"after_step": lambda loss: wandb.log({"loss": float(loss.detach())})})
    except ImportError:
        wrun = None
        print("wandb is not installed: its column is skipped", file=sys.stderr)

    gens = {k: torch.Generator().manual_seed(1) for k in variants}
    for name, ((model, opt, sched), hooks) in variants.items():  # warm-up, not timed
        run_steps(model, opt, sched, data, gens[name], 5, **hooks)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for name, ((model, opt, sched), hooks) in variants.items():
            times[name].append(run_steps(model, opt, sched, data, gens[name], args.steps, **hooks))
    mon.close()
    if wrun is not None:
        wrun.finish()

    print(f"reference model {MODEL}, batch 32, {args.reps} interleaved reps x {args.steps} steps, "
          f"torch threads {torch.get_num_threads()}")
    print("overhead = median over reps of (variant / plain of the same rep) - 1; CPU time is this "
          "process's (less sensitive to other load; wandb's separate service process is not counted)")
    result = {}
    for clock, i in (("wall", 0), ("cpu", 1)):
        over = {k: statistics.median(t[i] / p[i] for t, p in zip(v, times["plain"])) - 1 for k, v in times.items()}
        result[clock] = over
        for k, v in times.items():
            print(f"  {clock:4s} {k:9s} {statistics.median(t[i] for t in v) * 1e3:8.2f} ms/step   "
                  f"overhead {over[k] * 100:+6.1f} %")
    for clock, over in result.items():
        line = f"{clock}: diagnose overhead {over['diagnose'] * 100:.1f} % (goal <= 5 %)"
        if "wandb" in over:
            line += (f"; wandb.watch(log='all', log_freq=1) overhead {over['wandb'] * 100:.1f} %; "
                     f"diagnose / wandb {over['diagnose'] / over['wandb']:.3f} (goal <= 0.2)")
        print(line)

if __name__ == "__main__":
    main()
