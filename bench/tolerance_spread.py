"""How far float32 outputs move across kernel paths and thread counts: the measurement behind
SAFETY in diagnose/_tolerance.py.

    .venv/bin/python bench/tolerance_spread.py            # all paths, a table (about a minute)

For each family the tests use (the zoo Transformer; tiny GPT-2, BERT and LLaMA built from configs
as in tests/prune/test_hf.py, nothing downloaded) one child process per ATEN_CPU_CAPABILITY
(default, avx2, avx512) computes, with 1 and 2 threads:
  * the outputs of a batch (compared across processes and thread counts),
  * the same batch one example at a time (another matmul shape: the batch-size spread),
  * a pruned copy (diagnose.prune.cut) against the model with those heads zeroed by hand,
and saves them. The parent compares everything against default/1 thread and prints, per family and
path, max |diff| / (eps * output_scale * depth * sqrt(width)): the spread in the policy's units.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PATHS = ("default", "avx2", "avx512")
THREADS = (1, 2)
V = 40


def _families():
    import torch
    import transformers

    from diagnose.zoo import ModelConfig, Transformer

    def hf(cls, cfg):
        torch.manual_seed(0)
        cfg._attn_implementation = "sdpa"
        cfg.initializer_range = 0.2
        return getattr(transformers, cls)(cfg).eval()

    def zoo():
        torch.manual_seed(0)
        return Transformer(ModelConfig(vocab_size=V, max_len=16, init_std=0.2)).eval()

    return {
        "zoo": zoo,
        "gpt2": lambda: hf("GPT2LMHeadModel", transformers.GPT2Config(
            n_layer=2, n_head=4, n_embd=32, vocab_size=V, n_positions=16, bos_token_id=0, eos_token_id=0)),
        "bert": lambda: hf("BertForSequenceClassification", transformers.BertConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64, vocab_size=V,
            max_position_embeddings=16, num_labels=3)),
        "llama": lambda: hf("LlamaForCausalLM", transformers.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
            intermediate_size=64, vocab_size=V, max_position_embeddings=16)),
    }


def _zeroed(model, sites, removed):
    """The model with the removed heads' slices of the output projection zeroed: the prune tests' own
    reference (tests/prune/helpers.py), so bench and tests compare against one hand-made model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.prune.helpers import zeroed

    return zeroed(model, sites, removed)


def measure(out: Path) -> None:
    """Child: every family's outputs on this process's kernel path, saved to `out`."""
    import torch

    from diagnose._tolerance import model_size
    from diagnose.objectives import call_model, logits_of
    from diagnose.prune.cut import cut
    from diagnose.sites import find_heads

    ids = torch.randint(1, V, (16, 12), generator=torch.Generator().manual_seed(1))  # [B, T]
    saved = {"capability": torch.backends.cpu.get_cpu_capability(), "families": {}}
    for name, build in _families().items():
        model = build()
        sites = find_heads(model)
        removed = [(0, 1), (1, 0), (1, 3)]
        pruned, zeroed = cut(model, sites, removed).model.eval(), _zeroed(model, sites, removed)

        def run(m, x):
            with torch.no_grad():
                return logits_of(call_model(m, {"input_ids": x} if name != "zoo" else x)).float()

        rec = {"size": model_size(sites)}
        for t in THREADS:
            torch.set_num_threads(t)
            rec[f"batch/{t}"] = run(model, ids)
            rec[f"single/{t}"] = torch.cat([run(model, ids[i:i + 1]) for i in range(len(ids))])
            rec[f"pruned/{t}"] = run(pruned, ids)
            rec[f"zeroed/{t}"] = run(zeroed, ids)
        saved["families"][name] = rec
    torch.save(saved, out)


def compare(files: dict[str, Path]) -> list[dict]:
    """Parent: the spread of each family's outputs, in units of eps * scale * depth * sqrt(width)."""
    import torch

    from diagnose._tolerance import eps, output_scale

    runs = {path: torch.load(f) for path, f in files.items()}
    ref = runs[PATHS[0]]["families"]
    rows = []
    for fam, rec0 in ref.items():
        depth, width = rec0["size"]
        base = rec0[f"batch/{THREADS[0]}"]
        unit = eps() * output_scale(base) * depth * width ** 0.5
        for path, run in runs.items():
            rec = run["families"][fam]
            for t in THREADS:
                diffs = {
                    "path+threads": float((rec[f"batch/{t}"] - base).abs().max()),
                    "batch size": float((rec[f"single/{t}"] - rec[f"batch/{t}"]).abs().max()),
                    "pruned vs zeroed": float((rec[f"pruned/{t}"] - rec[f"zeroed/{t}"]).abs().max()),
                }
                rows.append({"family": fam, "path": f"{path} ({run['capability']})", "threads": t,
                             "depth": depth, "width": width, "scale": output_scale(base), "unit": unit,
                             **{k: v / unit for k, v in diffs.items()}, "max_abs": max(diffs.values())})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--keep", type=Path, help="folder to keep each path's outputs in")
    args = ap.parse_args()
    if args.child:
        measure(args.child)
        return
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tolerance-spread-"))
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for path in PATHS:
        files[path] = folder / f"{path}.pt"
        env = {**os.environ, "ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, __file__, "--child", str(files[path])], env=env, check=True)
    rows = compare(files)
    from diagnose._tolerance import SAFETY
    print("family  path              threads  depth width scale   path+threads  batch size  pruned vs zeroed"
          "   (units of eps*scale*depth*sqrt(width))")
    for r in rows:
        print(f"{r['family']:7s} {r['path']:17s} {r['threads']:7d}  {r['depth']:5d} {r['width']:5d} "
              f"{r['scale']:6.2f}  {r['path+threads']:12.2f}  {r['batch size']:10.2f}  {r['pruned vs zeroed']:16.2f}")
    worst = {}
    for r in rows:
        worst[r["family"]] = max(worst.get(r["family"], 0.0), r["path+threads"], r["batch size"], r["pruned vs zeroed"])
    for fam, w in worst.items():
        print(f"largest spread {fam}: {w:.2f} units; SAFETY {SAFETY:g} is {SAFETY / max(w, 1e-9):.0f}x above it")


if __name__ == "__main__":
    main()
