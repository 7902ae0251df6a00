"""Step-time overhead of TrainingMonitor at its defaults (every=10, attention_every=50), at
attention_every=10, and with every step logged (every=1, attention_every=10: the old defaults' cost), on
the reference model's training loop or a hand-written nanoGPT-style decoder (--model hand: no
adapter, found by the generic adapter's traced forward, attention read through the softmax
intercept), against the same loop unmonitored and the same loop under
wandb.watch(log="all", log_freq=1) in offline mode. Goals: diagnose <= 3 % at the defaults,
<= 5 % at attention_every=10, and <= 1/5 of wandb's.

Identical models, one per variant; the variants are interleaved step by step (plain's step, diag@50's
step, diag@10's, every1@10's, wandb's, then plain's next step, ...) so that load on the machine hits
all alike; a repetition is --steps steps of each, each variant's time in it is divided by the plain
loop's time in the same repetition, and the median ratio over the repetitions is reported, for
wall-clock and for this process's CPU time. --steps should be a multiple of 50 (every
repetition then holds the same share of logged steps). The load average before and after is
printed: the machine may be shared. Beside the repetitions' ratios, "paired steps": each step of a
variant against the plain loop's step taken just before it, the median CPU difference per kind of step
(light, logged, logged with attention) weighted by how often each comes (step_pairs).

--heads adds the monitor without the per-head signals (importance, roles, in-context score: issue 35)
at attention_every 50 and 10, and prints their own share: paired repetitions, and the sampled steps of
diag@10 against the same steps of diag@10-noheads.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_monitor.py [--model reference|hand] [--reps 15]
        [--steps 50] [--d-model 128] [--layers 4] [--no-wandb] [--heads] [--step-cost]
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

import math  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from diagnose.monitor import TrainingMonitor  # noqa: E402
from diagnose.monitor._measure import MEASUREMENTS  # noqa: E402  (the registry, to time the monitor without two entries)
from diagnose.objectives import score  # noqa: E402
from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, make_optimizer  # noqa: E402

MODEL = dict(n_layers=4, n_heads=4, d_model=128, max_len=32)


class _HandAttention(nn.Module):
    """nanoGPT's attention as users write it: explicit softmax, causal mask filled with -inf."""

    def __init__(self, d: int, n_heads: int, max_len: int):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x, pad):
        B, T, C = x.size()  # batch, sequence, embedding
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, nh, T, T)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        if pad is not None:
            att = att.masked_fill(pad[:, None, None, :], float("-inf"))
        y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class _HandBlock(nn.Module):
    def __init__(self, d, n_heads, max_len):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = _HandAttention(d, n_heads, max_len)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        x = x + self.attn(self.ln_1(x), pad)
        return x + self.mlp(self.ln_2(x))


class HandDecoder(nn.Module):
    """A hand-written decoder: forward(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]."""

    def __init__(self, vocab: int, d: int, n_heads: int, n_layers: int, max_len: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(_HandBlock(d, n_heads, max_len) for _ in range(n_layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask=None):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        pad = None if attention_mask is None else attention_mask == 0
        for block in self.h:
            x = block(x, pad)
        return self.lm_head(self.ln_f(x))


KIND = {"model": "reference"}


def make(seed: int = 0):
    torch.manual_seed(seed)
    if KIND["model"] == "hand":
        model = HandDecoder(32, MODEL["d_model"], MODEL["n_heads"], MODEL["n_layers"], MODEL["max_len"])
    else:
        model = Transformer(ModelConfig(**MODEL))  # MODEL may be changed by --d-model / --layers
    opt, sched = make_optimizer(model, TrainConfig(steps=10_000, warmup=50))
    return model, opt, sched


def one_step(model, opt, sched, data, gen, on_backward=None, after_step=None) -> tuple[float, float]:
    """(wall, CPU) seconds of one step of the zoo training loop (batch 32, clip 1.0)."""
    start, cpu = time.perf_counter(), time.process_time()
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
    return time.perf_counter() - start, time.process_time() - cpu


def run_rep(variants: dict, gens: dict, data, n: int, each: dict | None = None) -> dict[str, tuple[float, float]]:
    """One repetition: n steps of every variant, interleaved step by step (plain's step 0, diag@50's step
    0, ..., plain's step 1, ...), so that a change of the machine's load within the repetition falls on
    every variant alike; (wall, CPU) seconds per step of each. each: {variant: [CPU s of each step]}, appended."""
    sums = {k: [0.0, 0.0] for k in variants}
    for _ in range(n):
        for name, ((model, opt, sched), hooks) in variants.items():
            wall, cpu = one_step(model, opt, sched, data, gens[name], **hooks)
            sums[name][0] += wall
            sums[name][1] += cpu
            if each is not None:
                each.setdefault(name, []).append(cpu)
    return {k: (w / n, c / n) for k, (w, c) in sums.items()}


def _variants(tmp: str, no_wandb: bool):
    """The loops to time: plain, diagnose at its defaults, at attention_every=10, every step logged
    (every=1, attention_every=10), and wandb.watch when installed."""
    variants = {"plain": (make(), {})}
    monitors = []
    for name, kw in (("diag@50", {}), ("diag@10", {"attention_every": 10}),
                     ("every1@10", {"every": 1, "attention_every": 10})):
        diag = make()
        mon = TrainingMonitor(diag[0], os.path.join(tmp, name), clip=1.0, echo=False, **kw)
        monitors.append(mon)
        variants[name] = (diag, {"on_backward": lambda loss, opt, mon=mon: mon.step(loss, optimizer=opt)})
    wrun = None
    try:
        if no_wandb:
            raise ImportError("--no-wandb")
        import wandb

        wb = make()
        wrun = wandb.init(project="diagnose-bench", dir=tmp, mode="offline")
        wandb.watch(wb[0], log="all", log_freq=1)
        variants["wandb"] = (wb, {"after_step": lambda loss: wandb.log({"loss": float(loss.detach())})})
    except ImportError as exc:
        print(f"wandb is skipped ({exc})", file=sys.stderr)
    return variants, monitors, wrun


HEAD_SIGNALS = ("heads", "icl")  # per-head importance and roles, the in-context score (issue 35)


def _heads_variants(tmp: str, variants: dict, monitors: list) -> None:
    """--heads: the monitor at attention_every 50 and 10 without the per-head signals, paired with
    diag@50 and diag@10 in every repetition: their own cost at the default sampling and at 10."""
    for every in (10, 50):
        diag = make()
        with MEASUREMENTS.without(HEAD_SIGNALS):
            mon = TrainingMonitor(diag[0], os.path.join(tmp, f"run{every}-noheads"), attention_every=every,
                                  clip=1.0, echo=False)
        monitors.append(mon)
        variants[f"diag@{every}-noheads"] = (diag, {"on_backward": lambda loss, opt, mon=mon: mon.step(loss, optimizer=opt)})


def _report_heads(times, each: dict, first: int) -> None:
    """The per-head signals' share of the step time: from the repetitions' paired ratios, and from the
    sampled steps alone (each sampled step of diag@10 against the same step of diag@10-noheads, taken one
    after the other: their median CPU difference, over the plain loop's median step, is the cost of one
    sample; at the default sampling it is paid once in 50 steps)."""
    sampled = [i for i in range(len(each["plain"])) if (first + i) % 10 == 0]
    extra = statistics.median(each["diag@10"][i] - each["diag@10-noheads"][i] for i in sampled)
    plain = statistics.median(each["plain"])
    print(f"cpu, sampled steps alone ({len(sampled)} pairs): one sample of the per-head signals costs {extra * 1e3:.2f} ms "
          f"= {extra / plain * 100:.1f} % of a plain step ({plain * 1e3:.1f} ms): {extra / plain / 50 * 100:.2f} % "
          f"of the step time at attention_every=50 (the default; goal <= 1 point), {extra / plain / 10 * 100:.2f} % at 10")
    for clock, i in (("wall", 0), ("cpu", 1)):
        share = {e: (statistics.median(t[i] / o[i] for t, o in zip(times[f"diag@{e}"], times[f"diag@{e}-noheads"]))
                     - 1) * 100 for e in (50, 10)}
        print(f"{clock}: per-head importance, roles and in-context score, their own share of the step time: "
              f"{share[50]:.2f} % at attention_every=50 (the default; goal <= 1 point), {share[10]:.2f} % at 10")


SCHEDULE = {"diag@50": (10, 50), "diag@10": (10, 10), "every1@10": (1, 10), "diag@50-noheads": (10, 50),
            "diag@10-noheads": (10, 10), "wandb": (1, 1)}  # (every, attention_every) of each variant


def step_pairs(each: dict, first: int) -> dict[str, float]:
    """Each variant's overhead from its steps paired one by one with the plain loop's step taken just before
    it: per kind of step (light; logged; logged with attention), the median CPU difference over those pairs,
    weighted by how often that kind comes, over the plain loop's median step. Steps of one kind cost alike,
    so a median per kind drops the steps another job's burst hit, which a repetition's sum keeps."""
    plain = each["plain"]
    out = {}
    for name, (every, att) in SCHEDULE.items():
        if name not in each:
            continue
        kinds: dict[int, list[float]] = {}
        for i, t in enumerate(each[name]):
            s = first + i
            kinds.setdefault((s % every == 0) + (s % att == 0), []).append(t - plain[i])
        share = {k: (1 / att if k == 2 else 1 / every - 1 / att if k == 1 else 1 - 1 / every) for k in kinds}
        out[name] = sum(share[k] * statistics.median(v) for k, v in kinds.items()) / statistics.median(plain)
    return out


def _report(args, times, load_before) -> None:
    """Print each variant's median step time and overhead, then the goal lines."""
    print(f"{args.model} model {MODEL}, batch 32, {args.reps} interleaved reps x {args.steps} steps, "
          f"torch threads {torch.get_num_threads()}, load average {load_before[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after ({os.cpu_count()} CPUs)")
    print("overhead = median over reps of (variant / plain of the same rep) - 1; CPU time is this "
          "process's (less sensitive to other load; wandb's separate service process is not counted)")
    result = {}
    for clock, i in (("wall", 0), ("cpu", 1)):
        over = {k: statistics.median(t[i] / p[i] for t, p in zip(v, times["plain"])) - 1 for k, v in times.items()}
        result[clock] = over
        for k, v in times.items():
            print(f"  {clock:4s} {k:9s} {statistics.median(t[i] for t in v) * 1e3:8.2f} ms/step   "
                  f"overhead {over[k] * 100:+6.1f} %")
    for (clock, over), i in zip(result.items(), (0, 1)):
        line = (f"{clock}: diagnose overhead {over['diag@50'] * 100:.1f} % at the defaults (every=10, "
                f"attention_every=50; goal <= 3 %), {over['diag@10'] * 100:.1f} % at attention_every=10 (goal <= 5 %), "
                f"{over['every1@10'] * 100:.1f} % with every step logged (every=1, attention_every=10)")
        if "wandb" in over:
            line += (f"; wandb.watch(log='all', log_freq=1) overhead {over['wandb'] * 100:.1f} %; "
                     f"diagnose@50 / wandb {over['diag@50'] / over['wandb']:.3f} (goal <= 0.2)")
        print(line)


def step_cost(data, steps: int = 200) -> None:
    """--step-cost: CPU time of monitor.step() alone at the defaults, light steps and logged steps apart."""
    model, opt, sched = make()
    mon = TrainingMonitor(model, tempfile.mkdtemp(prefix="bench_monitor_"), clip=1.0, echo=False)
    gen, light, logged = torch.Generator().manual_seed(1), [], []
    for s in range(steps):
        idx = torch.randint(0, len(data), (32,), generator=gen)
        loss = score(model(data.input_ids[idx], attention_mask=data.attention_mask[idx]), data.labels[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t = time.process_time()
        mon.step(loss, optimizer=opt)
        (logged if s % mon.every == 0 else light).append(time.process_time() - t)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    mon.close()
    print(f"{KIND['model']} model: monitor.step() CPU median {statistics.median(light) * 1e3:.3f} ms on a light "
          f"step, {statistics.median(logged) * 1e3:.3f} ms on a logged step ({steps} steps, load average "
          f"{os.getloadavg()[0]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--d-model", type=int, default=MODEL["d_model"])
    ap.add_argument("--layers", type=int, default=MODEL["n_layers"])
    ap.add_argument("--model", choices=("reference", "hand"), default="reference")
    ap.add_argument("--no-wandb", action="store_true")
    ap.add_argument("--heads", action="store_true", help="also time the monitor without the per-head signals")
    ap.add_argument("--step-cost", action="store_true", help="time monitor.step() alone, light and logged steps")
    args = ap.parse_args()
    MODEL.update(d_model=args.d_model, n_layers=args.layers)
    KIND["model"] = args.model
    load_before = os.getloadavg()
    torch.set_num_threads(1)
    data = induction(n=2048, length=24, vocab_size=32)
    if args.step_cost:
        return step_cost(data)
    tmp = tempfile.mkdtemp(prefix="bench_monitor_")
    os.environ["WANDB_DIR"] = tmp
    variants, monitors, wrun = _variants(tmp, args.no_wandb)
    if args.heads:
        _heads_variants(tmp, variants, monitors)

    gens = {k: torch.Generator().manual_seed(1) for k in variants}
    run_rep(variants, gens, data, 5)  # warm-up, not timed: the monitors' steps 0-4
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    each: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for name, t in run_rep(variants, gens, data, args.steps, each).items():
            times[name].append(t)
    for mon in monitors:
        mon.close()
    if wrun is not None:
        wrun.finish()
    _report(args, times, load_before)
    pairs = step_pairs(each, first=5)
    print("cpu, paired steps (median per kind of step, weighted by how often it comes): " + ", ".join(
        f"{k} {v * 100:+.1f} %" for k, v in pairs.items()))
    if args.heads:
        _report_heads(times, each, first=5)


if __name__ == "__main__":
    main()
