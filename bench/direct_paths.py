"""Where each family's direct path comes from: declared by its adapter, traced from one forward, or not
found (with the one-line reason). Tiny models of the family table (diagnose/zoo/families.py), the
language models only (next-token loss needs no labels), two examples, direct effects only.

    OMP_NUM_THREADS=1 .venv/bin/python bench/direct_paths.py [--only GPT-2,Gemma2]
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

from diagnose.ablation import ablate_heads  # noqa: E402
from diagnose.errors import DiagnoseError  # noqa: E402
from diagnose.sites import find_heads  # noqa: E402
from diagnose.zoo.families import FAMILIES, SMALL, build  # noqa: E402


def path(name: str) -> str:
    model = build(name, "eager")
    ids = torch.randint(3, SMALL["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    sites = find_heads(model, example=inputs)
    result = ablate_heads(model, [(inputs, None)], task="lm", sites=sites, progress=False, attention=False, n_boot=50)
    d = result.direct
    return d["path"] if d["measured"] else f"not measured: {d['reason']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}\n")
    for name, fam in FAMILIES.items():
        if fam.kind != "lm" or (args.only and name not in args.only.split(",")):
            continue
        try:
            print(f"| {name} | {path(name)} |", flush=True)
        except (DiagnoseError, RuntimeError, ValueError) as exc:  # a family the tool does not handle: say how
            print(f"| {name} | error: {type(exc).__name__}: {str(exc).splitlines()[0][:100]} |", flush=True)


if __name__ == "__main__":
    main()
