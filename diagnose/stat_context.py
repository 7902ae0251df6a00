"""What a per-head attention statistic sees: the batch it came from, and one chunk of attention rows.

HeadStats reads each map by chunks of query rows (memory O(chunk x Tk) whatever the length) and
hands every registered statistic (statistics.py) the same `Chunk`: the probabilities, the positions
of its queries and keys, the batch's key mask and token ids (a `BatchContext`), and `at(k)`, the
weight on one key per row. A statistic returns its value per row, [B, H, c].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch


@dataclass(frozen=True)
class BatchContext:
    """The inputs of one batch that a statistic may read besides the map.

    key_mask [B, Tk] (1 real token, 0 padding) or None; input_ids [B, Tk] or None (a statistic
    with needs_tokens reads them; without them it is NaN for the batch).
    """

    key_mask: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, inputs: Any) -> "BatchContext":
        """The mask and token ids that a model's inputs carry (a Tensor [B, T] of ids, or a Mapping)."""
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
        ids_ok = isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
        return cls(mask if isinstance(mask, torch.Tensor) else None, ids if ids_ok else None)

    def fit(self, n_keys: int) -> "BatchContext":
        """This context for a map over `n_keys` keys: a mask or ids of another length (a cache, cross
        attention) say nothing about those keys and are dropped."""
        def keep(x: torch.Tensor | None) -> torch.Tensor | None:
            return x if x is not None and x.shape[-1] == n_keys else None
        return BatchContext(keep(self.key_mask), keep(self.input_ids))


class Chunk:
    """Query rows start..start+c of one map, read against keys 0..K-1 (keys from K on weigh 0 here).

    p [B, H, c, K] float32; q_pos [c] the queries' positions among the keys (queries are the last Tq
    of Tk positions); k_pos [K]; keys [B, Tk] key weights (1 real, 0 padding); last [B, 1, 1, 1] each
    example's last real key; offset = Tk - Tq; batch the BatchContext.
    """

    def __init__(self, p: torch.Tensor, start: int, Tk: int, keys: torch.Tensor, last: torch.Tensor,
                 offset: int, batch: BatchContext):
        self.p = p
        self.B, self.H, self.c, self.K = p.shape
        self.Tk, self.offset, self.keys, self.last, self.batch = Tk, offset, keys, last, batch
        self.first_query = start + offset  # position of row 0 of this chunk among the keys
        self.q_pos = torch.arange(start, start + self.c, device=p.device) + offset  # [c]
        self.k_pos = torch.arange(self.K, device=p.device)  # [K]

    def zeros(self) -> torch.Tensor:
        return self.p.new_zeros(self.p.shape[:3])  # [B, H, c]

    def at(self, k: torch.Tensor) -> torch.Tensor:
        """Weight on key k ([c] per row, or [B, 1, 1, 1] per example; 0 where k is outside 0..K-1).  # [B, H, c]"""
        B, H, c, K = self.B, self.H, self.c, self.K
        rows = c if k.dim() == 1 else 1
        idx = k.clamp(0, K - 1).view(-1, 1, rows, 1).expand(B, H, c, 1)
        return self.p.gather(-1, idx)[..., 0] * ((k >= 0) & (k < K)).view(-1, 1, rows)

    @property
    def key_ids(self) -> torch.Tensor | None:
        """Token ids of the keys read here  # [B, K], or None without ids."""
        ids = self.batch.input_ids
        return None if ids is None else ids[:, :self.K].to(self.p.device)

    @property
    def query_ids(self) -> torch.Tensor | None:
        """Token ids of the query rows  # [B, c], or None without ids (or when queries are not among the keys)."""
        ids = self.batch.input_ids
        if ids is None or self.offset < 0:
            return None
        return ids[:, self.first_query:self.first_query + self.c].to(self.p.device)
