"""Synthetic tasks with known mechanisms, deterministic from a seed.

Each returns a TaskData: input_ids [N, T], attention_mask [N, T] (1 real, 0 padding), labels
([N] for sequence classification, [N, T] aligned with the logits for token prediction, -100
where there is nothing to predict), and the task type the analyses should use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ConfigError

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
            meta = {k: v[sl] if isinstance(v, torch.Tensor) and v.dim() and len(v) == len(self) else v
                    for k, v in self.meta.items()}  # per-example entries are split too
            return TaskData(self.name, self.task, self.input_ids[sl], self.attention_mask[sl], self.labels[sl],
                            self.vocab_size, self.n_classes, self.description, meta)

        return part(slice(0, n_first)), part(slice(n_first, None))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The DESIGN.md data-file layout: input_ids, attention_mask, labels."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}


def induction(n: int = 2048, length: int = 24, vocab_size: int = 24, min_period: int = 4,
              max_period: int = 10, seed: int = 0) -> TaskData:
    """[BOS, s_1..s_d, s_1..s_d, s_1..]: a random segment of d distinct tokens repeated up to
    `length` tokens, with the period d drawn per example from [min_period, max_period].

    From the second period on, the next token is predictable only by copying: find the
    previous occurrence of the current token and predict the token that followed it (an
    induction head in layer 1, reading a previous-token head in layer 0). Because the period
    varies, no fixed positional offset leads to the answer. Token 0 is BOS; labels are the
    next token where it is predictable, -100 elsewhere; meta["periods"] holds each d.
    """
    if not 1 <= min_period <= max_period < vocab_size:
        raise ConfigError(f"induction: need 1 <= min_period <= max_period < vocab_size, got min_period={min_period}, "
                          f"max_period={max_period}, vocab_size={vocab_size}")
    g = torch.Generator().manual_seed(seed)
    periods = torch.randint(min_period, max_period + 1, (n,), generator=g)  # [N]
    segments = torch.rand(n, vocab_size - 1, generator=g).argsort(dim=1)[:, :max_period] + 1  # [N, max_period], distinct
    pos = torch.arange(length)[None, :]  # token j (1-based) is segment[(j - 1) % d]
    body = segments.gather(1, pos % periods[:, None])  # [N, length]
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), body], dim=1)  # [N, length + 1]
    labels = torch.full_like(ids, IGNORE)
    j = torch.arange(length)[None, :]  # predict ids[:, j + 1] from position j
    predictable = j >= periods[:, None] + 1  # the current token has occurred before
    labels[:, :length][predictable] = ids[:, 1:][predictable]
    return TaskData("induction", "lm", ids, torch.ones_like(ids), labels, vocab_size,
                    description="a random segment repeated with a random period; later tokens "
                                "predictable only by copying (induction)",
                    meta={"periods": periods, "bos": 0})


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
