"""Synthetic tasks with known mechanisms, deterministic from a seed.

Each returns a TaskData: input_ids [N, T], attention_mask [N, T] (1 real, 0 padding), labels
([N] for sequence classification, [N, T] aligned with the logits for token prediction, -100
where there is nothing to predict), and the task type the analyses should use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

IGNORE = -100


@dataclass
class TaskData:
    name: str
    task: str  # "lm" (token prediction, logits [B, T, V]) or "classification" (logits [B, C])
    input_ids: torch.Tensor  # [N, T] int64
    attention_mask: torch.Tensor  # [N, T] int64
    labels: torch.Tensor  # [N] or [N, T] int64
    vocab_size: int
    n_classes: int = 0
    description: str = ""
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def split(self, n_first: int) -> tuple["TaskData", "TaskData"]:
        """First n_first examples and the rest, e.g. train / eval."""

        def part(sl: slice) -> "TaskData":
            return TaskData(self.name, self.task, self.input_ids[sl], self.attention_mask[sl], self.labels[sl],
                            self.vocab_size, self.n_classes, self.description, dict(self.meta))

        return part(slice(0, n_first)), part(slice(n_first, None))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The DESIGN.md data-file layout: input_ids, attention_mask, labels."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}


def induction(n: int = 2048, half: int = 12, vocab_size: int = 32, seed: int = 0) -> TaskData:
    """[BOS, r_1..r_k, r_1..r_k]: the second half is predictable only by copying.

    Token 0 is BOS. Labels are the next token, but only where it is predictable: predicting
    r_{i+1} at the second copy of r_i (the induction mechanism: a previous-token head in
    one layer, an induction head after it). Everything else is -100.
    """
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(1, vocab_size, (n, half), generator=g)  # [N, k]
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), rand, rand], dim=1)  # [N, 2k+1]
    labels = torch.full_like(ids, IGNORE)
    # the second copy of r_i sits at p = k + i; from there r_{i+1} = ids[:, p + 1] is predictable
    second_start = 1 + half
    for p in range(second_start, 2 * half):
        labels[:, p] = ids[:, p + 1]
    return TaskData("induction", "lm", ids, torch.ones_like(ids), labels, vocab_size,
                    description="random tokens repeated once; second half predictable only by copying",
                    meta={"half": half, "bos": 0})


def order(n: int = 4096, length: int = 8, vocab_size: int = 16, seed: int = 0) -> TaskData:
    """Is the first token larger than the last? Impossible without positions.

    The multiset of tokens carries no information about which token is first or last, so
    a model that cannot see positions (and pools by mean) is at chance.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (n, length), generator=g)
    same = ids[:, 0] == ids[:, -1]
    ids[same, -1] = (ids[same, 0] % (vocab_size - 1)) + 1  # no ties
    labels = (ids[:, 0] > ids[:, -1]).long()
    return TaskData("order", "classification", ids, torch.ones_like(ids), labels, vocab_size, n_classes=2,
                    description="label = first token > last token; needs positional information")


def padded_majority(n: int = 4096, max_len: int = 16, min_len: int = 3, vocab_size: int = 8,
                    seed: int = 0) -> TaskData:
    """Variable-length sequences padded with token 0: are there more 1s than 2s?

    Lengths vary, so a model whose padding leaks into attention sees the pads diluting
    the counts differently for each length. Ties are broken so labels are balanced.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    ids = torch.randint(1, vocab_size, (n, max_len), generator=g)
    pos = torch.arange(max_len)[None, :]
    mask = (pos < lengths[:, None]).long()
    ones, twos = ((ids == 1) & (mask == 1)).sum(1), ((ids == 2) & (mask == 1)).sum(1)
    tie = ones == twos
    ids[tie, 0] = torch.where(torch.rand(int(tie.sum()), generator=g) < 0.5, 1, 2)  # break ties
    ones, twos = ((ids == 1) & (mask == 1)).sum(1), ((ids == 2) & (mask == 1)).sum(1)
    ids = ids * mask  # padding token is 0
    labels = (ones > twos).long()
    return TaskData("padding", "classification", ids, mask, labels, vocab_size, n_classes=2,
                    description="variable length with padding: more 1s than 2s?", meta={"pad_id": 0})


TASKS = {"induction": induction, "order": order, "padding": padded_majority}
