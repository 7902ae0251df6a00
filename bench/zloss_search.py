"""The search for a small proxy whose output logits diverge late and which z-loss cures (issue 33, item 3).

Beyond bench_proxies.py's byte-level proxy (256 outputs, final LayerNorm: z never diverged, docs/monitor.md),
this tries what Wortsman et al. 2023 and Stollenwerk et al. 2026 name: a larger vocabulary where most
outputs are rare (a word-level vocabulary of the same text, V up to 8,192: Adam moves every rare output
row by about the lr per step in the same direction, the anisotropy Stollenwerk et al. blame), no final
norm, no weight decay, a high lr held late (constant or cosine), with and without z-loss 1e-4. No monitor
here (cheap): z, the mean logit and the loss are read every `--every` steps from the training batch.

    OMP_NUM_THREADS=1 .venv/bin/python bench/zloss_search.py --vocab 4096 --lr 0.03 --steps 2000 [--final-norm]
        [--cosine] [--tied] [--zloss 1e-4]
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _proxy import ProxyBlock, batches, corpus  # noqa: E402


def word_corpus(vocab: int) -> torch.Tensor:
    """The Python Language Reference as word-level token ids: words, single punctuation marks and runs
    of white space, the `vocab - 1` most common by count, the rest one unknown id (vocab - 1).  # [N]"""
    text = bytes(corpus().tolist()).decode("utf-8")
    words = re.findall(r"\w+|\s+|[^\w\s]", text)
    ids = {w: i for i, (w, _) in enumerate(collections.Counter(words).most_common(vocab - 1))}
    return torch.tensor([ids.get(w, vocab - 1) for w in words], dtype=torch.long)


class Decoder(nn.Module):
    """ProxyDecoder with a vocabulary of `vocab` and the final norm optional.  forward(idx [B, T]) -> [B, T, V]"""

    def __init__(self, vocab: int, d: int, n_layers: int, final_norm: bool, tied: bool, max_len: int = 64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(ProxyBlock(d, 4, qk_norm=True) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d) if final_norm else nn.Identity()
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        if tied:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))  # (B, T, d)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def run(args: argparse.Namespace, data: torch.Tensor, vocab: int, z_loss: float) -> list[tuple]:
    torch.manual_seed(0)
    model = Decoder(vocab, args.d, args.layers, args.final_norm, args.tied)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95), eps=args.eps)

    def scale(s: int) -> float:
        warm = min(1.0, (s + 1) / args.warmup)
        return warm * (0.5 * (1 + math.cos(math.pi * s / args.steps)) if args.cosine else 1.0)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, scale)
    rows, acc = [], []
    for s, (x, y) in enumerate(batches(data, args.steps, args.batch, 64, 0)):
        logits = model(x)  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        z = torch.logsumexp(logits.float(), -1)  # [B, T]
        total = loss + z_loss * z.square().mean() if z_loss else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        sched.step()
        acc.append(loss.item())
        if s % args.every == 0 or s == args.steps - 1 or not math.isfinite(acc[-1]):
            rows.append((s, sum(acc[-20:]) / len(acc[-20:]), float(z.detach().mean()), float(z.detach().square().mean().sqrt()),
                         float(logits.detach().mean())))
            if not math.isfinite(acc[-1]):
                break
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=4096, help="word-level vocabulary size (256: the bytes)")
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--final-norm", action="store_true")
    ap.add_argument("--cosine", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--zloss", default="0,1e-4", help="z-loss coefficients to run, comma-separated")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = corpus() if args.vocab == 256 else word_corpus(args.vocab)
    print(f"# {vars(args)}; {len(data):,} tokens; torch {torch.__version__}", flush=True)
    for zl in (float(v) for v in args.zloss.split(",")):
        t0 = time.perf_counter()
        rows = run(args, data, args.vocab, zl)
        print(f"## z-loss {zl:g} ({time.perf_counter() - t0:.0f} s): step loss20 z_mean z_rms mean_logit")
        for r in rows:
            print(f"{r[0]} {r[1]:.3f} {r[2]:+.2f} {r[3]:.2f} {r[4]:+.2f}", flush=True)


if __name__ == "__main__":
    main()
