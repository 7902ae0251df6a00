"""Peak memory of attention statistics on one long sequence: diagnose.attention_summary vs
TransformerLens run_with_cache, at growing lengths T.

Model: Hugging Face GPT-2, 2 layers, 4 heads, d_model 64, random init, SDPA attention for
diagnose (it recomputes the probabilities by chunks of query rows, so no [H, T, T] map is made),
the same folder booted as a TransformerLens TransformerBridge for run_with_cache (which keeps
every layer's scores and pattern, 2 x L x H x T^2 floats). One example per T, one fresh
process per measurement so that peaks (bench/_peak.py) do not mix. TransformerLens runs only while
its cache alone fits --cap-gb (default 4 GiB: the machine is shared), also enforced with
RLIMIT_AS; the largest T that fits is where the two are compared.

    .venv/bin/python bench/bench_long_context.py [--lengths 1024,2048,4096,8192,16384] [--cap-gb 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _peak import peak_bytes

LAYERS, HEADS, D_MODEL, VOCAB = 2, 4, 64, 256


def worker(side: str, folder: str, T: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    if side == "tl":
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(folder, device="cpu")
    else:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa")
    model.eval()
    import diagnose

    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))  # [1, T]
    start = time.perf_counter()
    out: dict = {"side": side, "T": T}
    with torch.no_grad():
        if side == "tl":
            _, cache = model.run_with_cache(ids)
            out["cached_gib"] = sum(v.numel() * v.element_size() for v in cache.values()) / 2**30
            del cache
        else:
            s = diagnose.attention_summary(model, [ids], keep=1)
            out["entropy_layer0"] = s.stats[0]["entropy"]
    out["seconds"] = time.perf_counter() - start
    out["peak_gib"] = peak_bytes() / 2**30
    return out


def _run(side: str, folder: str, T: int, threads: int, cap_gb: float | None) -> dict | None:
    def limit() -> None:
        if cap_gb is not None:  # address space: the cap plus room for the libraries torch maps
            n = int((cap_gb + 6) * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (n, n))

    cmd = [sys.executable, __file__, "--worker", side, "--folder", folder, "--T", str(T), "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit)
    if res.returncode:
        why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit code {res.returncode}"
        print(f"  {side} at T={T} failed: {why}")
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--cap-gb", type=float, default=4.0, help="TransformerLens runs only while its cache fits this")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", choices=("diagnose", "tl"))
    ap.add_argument("--folder")
    ap.add_argument("--T", type=int)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.T, args.threads)))
        return

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    lengths = [int(t) for t in args.lengths.split(",")]
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=D_MODEL, n_positions=max(lengths), vocab_size=VOCAB,
                     bos_token_id=0, eos_token_id=0)
    print(f"GPT-2 {LAYERS} layers x {HEADS} heads, d_model {D_MODEL}; one sequence of T tokens; "
          f"{args.threads} thread(s); load average {os.getloadavg()[0]:.1f}")
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / "gpt2")
        GPT2LMHeadModel(cfg).save_pretrained(folder)
        for T in lengths:
            cache_gib = 2 * LAYERS * HEADS * T * T * 4 / 2**30  # scores and pattern, float32
            tl = _run("tl", folder, T, args.threads, args.cap_gb) if cache_gib <= args.cap_gb else None
            ours = _run("diagnose", folder, T, args.threads, None)
            rows[T] = {"diagnose": ours, "tl": tl}
            line = f"T={T:6d}  diagnose peak {ours['peak_gib']:6.2f} GiB {ours['seconds']:7.1f} s" if ours else \
                f"T={T:6d}  diagnose failed"
            if tl and ours:
                line += (f"   TransformerLens peak {tl['peak_gib']:6.2f} GiB {tl['seconds']:7.1f} s "
                         f"(cache {tl['cached_gib']:.2f} GiB)   ratio {ours['peak_gib'] / tl['peak_gib']:.3f}")
            elif cache_gib > args.cap_gb:
                line += f"   TransformerLens not run (its cache alone: {cache_gib:.2f} GiB > cap {args.cap_gb} GiB)"
            print(line, flush=True)
    fits = [T for T, r in rows.items() if r["tl"] and r["diagnose"]]
    if fits:
        T = max(fits)
        o, t = rows[T]["diagnose"], rows[T]["tl"]
        print(f"\nlargest T that TransformerLens fits under the cap: {T}: peak RSS diagnose / TransformerLens = "
              f"{o['peak_gib'] / t['peak_gib']:.3f} ({o['peak_gib']:.2f} vs {t['peak_gib']:.2f} GiB)")
    done = [T for T, r in rows.items() if r["diagnose"]]
    if done:
        T = max(done)
        print(f"longest T summarised by diagnose: {T}, peak {rows[T]['diagnose']['peak_gib']:.2f} GiB "
              f"(one head's whole map would be {T * T * 4 / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
