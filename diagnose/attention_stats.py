"""Per-head attention statistics, accumulated batch by batch without keeping the maps.

Which statistics, how each is computed and over which query rows it is averaged is the registry's
(statistics.py): entropy (nats), max_weight, mass on the first token, on itself, on the previous
and next positions (over the rows that have one), on padding, on the example's last real key
([SEP] in BERT-style inputs) and within LOCAL positions, and the mean distance. HeadStats keeps
each one's running sum and each denominator's count by name, so shards merge by adding them.
Full maps are kept for the first `keep` examples only, so memory does not grow with the data set.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from .adapters import LazyProbs, Probs, float32_only, query_chunks
from .adapters.base import AttentionSite
from .objectives import batch_size_of, call_model
from .stat_context import BatchContext, Chunk
from .statistics import ATTENTION_STATS, DENOMINATORS, STATISTICS, entropy as _entropy

STATS = ATTENTION_STATS  # the registry's names (statistics.py), in the order they are written
SCHEMA = "diagnose.attention/1"
_CHUNK = 1 << 22  # elements of probability per reduction step (a chunk of query rows): bounds the temporaries
_MAP_BUDGET = 1 << 24  # attention elements per map and forward in attention_summary (64 MB float32)
WINDOW = 512  # kept maps cover at most the first WINDOW queries and keys (a 16k map would be 1 GB per head)


def _masks(probs: Probs, key_mask: torch.Tensor | None):
    """(key weights [B, Tk], query weights [B, Tq], offset of query 0 among the keys)."""
    B, _, Tq, Tk = probs.shape
    off = Tk - Tq  # queries are the last Tq positions (a cache may hold earlier keys)
    keys = torch.ones(B, Tk, device=probs.device) if key_mask is None else key_mask.to(probs.device, torch.float32)
    return keys, keys[:, off:], off


@torch.no_grad()
def entropy_and_max(probs: Probs, key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy (nats) and mean max weight per head over real query rows.  # [H], [H] on the device

    probs [B, H, Tq, Tk] (a Tensor or LazyProbs, read by query chunks); key_mask [B, Tk] with 1
    for real tokens, 0 for padding. No host sync.
    """
    _, qw, _ = _masks(probs, key_mask)
    ent_sum = mx_sum = 0.0
    with float32_only(probs.device):
        for s, p in query_chunks(probs, _CHUNK):  # p [B, H, c, Tk] float32
            w = qw[:, None, s:s + p.shape[-2]]  # [B, 1, c]
            ent_sum = ent_sum + (_entropy(p) * w).sum((0, 2))
            mx_sum = mx_sum + (p.amax(-1) * w).sum((0, 2))
    n = (qw.sum() * 1.0).clamp_min(1.0)
    return ent_sum / n, mx_sum / n


@torch.no_grad()
def uniform_entropy(probs: Probs, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy (nats) of uniform attention over the keys each query can see, mean over real rows.  # [] on the device

    A key is visible to a query when any head gives it weight (the model's own causal and
    padding masks give exactly 0 under -inf, finfo.min or -1e4 fills) and it is not padding.
    So this is the mean of log(number of visible keys): what a head at initialisation, whose
    scores are all alike, should be close to. No host sync.
    """
    keys, qw, _ = _masks(probs, key_mask)
    total = torch.zeros((), device=probs.device)
    for s, p in query_chunks(probs, _CHUNK):
        visible = (p > 0).any(1) & (keys[:, None, :p.shape[-1]] > 0)  # [B, c, K]
        n = visible.sum(-1).clamp_min(1).float().log()  # [B, c]
        total = total + (n * qw[:, s:s + p.shape[-2]]).sum()
    return total / qw.sum().clamp_min(1.0)


class HeadStats:
    """Running per-head sums of every registered statistic, fed one batch of maps at a time.

    `sums[name]` [H] is a statistic's sum over the rows its denominator counts, `counts[denominator]`
    [] the number of those rows (real query rows; with a previous position; ...), both float64
    (float32 on MPS). Each map is read by chunks of query rows against all keys (query_chunks),
    so memory is O(chunk x Tk) whatever the sequence length. The statistics are those registered
    when the HeadStats is made (or those of `names` only: the monitor's role statistics).
    """

    def __init__(self, n_heads: int, names: Sequence[str] | None = None):
        self.n_heads = n_heads
        self.denominators = {name: s.denominator for name, s in STATISTICS.items()  # names only: pickles
                             if names is None or name in names}
        self.sums: dict[str, torch.Tensor] = {}  # statistic -> [H]; empty until the first batch
        self.counts: dict[str, torch.Tensor] = {}  # denominator -> []

    @torch.no_grad()
    def update(self, probs: Probs, key_mask: torch.Tensor | None = None, *,
               batch: BatchContext | None = None) -> None:
        """Add a batch: probs [B, H, Tq, Tk] (Tensor or LazyProbs); key_mask [B, Tk] (1 real, 0 padding)
        or None, or the whole `batch` context (mask and token ids) for statistics that need token ids."""
        B, H, Tq, Tk = probs.shape
        assert H == self.n_heads, f"expected {self.n_heads} heads, got probs {tuple(probs.shape)}"
        assert key_mask is None or batch is None, "pass the key mask inside the batch context, not both"
        batch = (batch or BatchContext(key_mask)).fit(Tk)
        with float32_only(probs.device):
            self._update(probs, batch)

    def _update(self, probs: Probs, batch: BatchContext) -> None:
        B, H, Tq, Tk = probs.shape
        keys, queries, off = _masks(probs, batch.key_mask)
        dev = probs.device
        acc_dtype = torch.float32 if dev.type == "mps" else torch.float64
        if not self.sums:
            self.sums = {k: torch.zeros(H, dtype=acc_dtype, device=dev) for k in self.denominators}
            used = dict.fromkeys(self.denominators.values())  # each denominator once, in registry order
            self.counts = {d: torch.zeros((), dtype=acc_dtype, device=dev) for d in used}
        k_pos = torch.arange(Tk, device=dev)
        last = (keys * (k_pos + 1)).argmax(-1).view(B, 1, 1, 1)  # [B, 1, 1, 1] last real key
        for s, p in query_chunks(probs, _CHUNK):  # p [B, H, c, K] float32
            chunk = Chunk(p, s, Tk, keys, last, off, batch)
            qw = queries[:, None, s:s + chunk.c]  # [B, 1, c] real query rows
            weights = {}  # denominator -> [B, 1, c]
            for d in self.counts:
                row = DENOMINATORS[d](chunk)
                weights[d] = qw if row is None else qw * row
                self.counts[d] += weights[d].sum().to(acc_dtype)
            for name, d in self.denominators.items():
                self.sums[name] += (self._values(name, chunk) * weights[d]).sum((0, 2)).to(acc_dtype)  # [H]

    @staticmethod
    def _values(name: str, chunk: Chunk) -> torch.Tensor:
        """One statistic on each row of the chunk  # [B, H, c]; NaN when it needs token ids the batch lacks."""
        stat = STATISTICS[name]
        if stat.needs_tokens and chunk.batch.input_ids is None:
            return chunk.p.new_full(chunk.p.shape[:3], math.nan)
        return stat.compute(chunk)

    def result(self) -> dict[str, list[float]]:
        """Mean per head of each statistic (one host sync)."""
        if not self.sums:
            return {k: [math.nan] * self.n_heads for k in self.denominators}
        names = list(self.denominators)
        means = torch.stack([self.sums[k] / self.counts[self.denominators[k]].clamp_min(1.0) for k in names])
        values = means.tolist()  # [statistic][head]
        return {k: values[i] for i, k in enumerate(names)}

    def to(self, device: str | torch.device) -> "HeadStats":
        """A copy whose sums and counts sit on `device` (the CPU, to send them to other ranks)."""
        out = HeadStats.__new__(HeadStats)
        out.n_heads, out.denominators = self.n_heads, dict(self.denominators)
        out.sums = {k: v.to(device) for k, v in self.sums.items()}
        out.counts = {k: v.to(device) for k, v in self.counts.items()}
        return out

    @classmethod
    def merge(cls, parts: Sequence["HeadStats"]) -> "HeadStats":
        """Shards' statistics as one: the raw sums and the counts added by name, in the order given
        (on the CPU, float64), so the means are those of one accumulator fed every shard's batches."""
        assert parts, "nothing to merge"
        first = parts[0]
        assert all(p.n_heads == first.n_heads and p.denominators == first.denominators for p in parts), \
            "shards computed different statistics or head counts"
        out = cls.__new__(cls)
        out.n_heads, out.denominators, out.sums, out.counts = first.n_heads, dict(first.denominators), {}, {}
        for part in (p.to("cpu") for p in parts if p.sums):
            for group, into in ((part.sums, out.sums), (part.counts, out.counts)):
                for k, v in group.items():
                    into[k] = into[k] + v.double() if k in into else v.double()
        return out


@dataclass
class AttentionSummary:
    """Per-site, per-head statistics over a data set, plus full maps of the first few examples."""

    sites: list[dict]  # layer, name, n_heads, head_dim
    stats: list[dict[str, list[float]]]  # per site: statistic -> one value per head
    examples: list[torch.Tensor] = field(repr=False)  # per site [keep, H, <=WINDOW, <=WINDOW] float32, on the CPU
    n_examples: int = 0
    window: int | None = None  # kept maps cover only the first `window` queries and keys; None: whole maps
    totals: list[HeadStats] = field(default_factory=list, repr=False)  # per site, on the CPU: to merge shards

    def head(self, layer: int, head: int) -> dict[str, float]:
        """The statistics of one head, as in the heads JSON `attention` field."""
        return {k: self.stats[layer][k][head] for k in STATS}

    def to_json(self, *, maps: bool = False) -> dict:
        """Plain data (`diagnose.attention/1`); with maps=True the kept examples' maps too."""
        out = {"schema": SCHEMA, "n_examples": self.n_examples,
               "sites": [{**s, "stats": st} for s, st in zip(self.sites, self.stats)]}
        if maps:
            out["maps_window"] = self.window
            for s, ex in zip(out["sites"], self.examples):
                s["maps"] = ex.tolist()
        return out


def _batches(data: Any, batch_size: int) -> Iterable[Any]:
    if hasattr(data, "batches"):
        return data.batches(batch_size)
    return data


def _inputs_of(item: Any) -> Any:
    """An item of data: (inputs, labels) pairs, or bare inputs."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0]
    return item


def key_mask_of(inputs: Any) -> torch.Tensor | None:
    """attention_mask [B, T] when the inputs carry one."""
    if isinstance(inputs, Mapping) and isinstance(inputs.get("attention_mask"), torch.Tensor):
        return inputs["attention_mask"]
    return None


def attention_summary(model: nn.Module, data: Any, *, keep: int = 4, batch_size: int = 32,
                      sites: list[AttentionSite] | None = None, attention_module: str | None = None,
                      n_heads: int | None = None, micro_batch: int | None = None,
                      window: int = WINDOW) -> AttentionSummary:
    """Stream `data` through the model once and summarise every head's attention.

    data: an iterable of (inputs, labels) pairs (or of inputs), or a DataSet with
    .batches(batch_size). Only the maps of the first `keep` examples are kept, and of those
    only the first `window` queries and keys (default 512; summary.window says when that cut
    anything). Statistics are per example, so each batch is run in micro-batches of
    `micro_batch` examples (default: as many as keep one [b, H, T, T] map under 2**24
    elements; 0: never split), which bounds memory by the sequence length, not by the batch
    size. Each map is read by chunks of query rows against all keys, so where diagnose
    recomputes the probabilities (SDPA, fused kernels) no [H, T, T] map is ever made: memory
    is O(chunk x T). A model that writes its own softmax makes its [B, H, T, T] map itself;
    diagnose reads it in place and adds only a chunk to it.
    """
    from .sites import find_heads

    it = iter(_batches(data, batch_size))
    first = _first(it)
    if sites is None:
        sites = find_heads(model, attention_module=attention_module, n_heads=n_heads, example=_inputs_of(first))
    accs = [HeadStats(s.n_heads) for s in sites]
    kept: list[list[torch.Tensor]] = [[] for _ in sites]
    state = {"batch": BatchContext(), "room": keep, "windowed": False}

    def callback(i: int):
        def on_probs(probs: Probs) -> None:  # [B, H, Tq, Tk]
            accs[i].update(probs, batch=state["batch"])  # the batch's mask and ids, when they fit the keys
            if state["room"] > 0:
                kept[i].append(_window(probs, state["room"], window))
                state["windowed"] |= max(probs.shape[-2:]) > window
        return on_probs

    n = 0
    with ExitStack() as stack, torch.no_grad():
        for i, s in enumerate(sites):
            stack.enter_context(s.adapter.watch_pattern(s, callback(i)))
        batch = first
        while batch is not None:
            inputs = _inputs_of(batch)
            if micro_batch is None:
                micro_batch = _auto_micro_batch(inputs, max(s.n_heads for s in sites))
            for part in split_batch(inputs, micro_batch):
                state["batch"] = BatchContext.of(part)
                call_model(model, part)
                B = batch_size_of(part)
                n += B
                state["room"] = max(0, state["room"] - B)
            batch = next(it, None)
    return _assemble(sites, accs, kept, n, window if state["windowed"] else None)


def _first(it: Any) -> Any:
    """The first batch; no data at all is a DataError."""
    first = next(it, None)
    if first is None:
        from .errors import DataError

        raise DataError("attention_summary got no data")
    return first


def _assemble(sites: list[AttentionSite], accs: list["HeadStats"], kept: list[list[torch.Tensor]], n: int,
              window: int | None) -> AttentionSummary:
    """The summary from each site's accumulated statistics and kept maps."""
    examples = [torch.cat(k) if k else torch.empty(0) for k in kept]
    info = [{"layer": s.layer, "name": s.name, "n_heads": s.n_heads, "head_dim": s.head_dim} for s in sites]
    return AttentionSummary(info, [a.result() for a in accs], examples, n, window, [a.to("cpu") for a in accs])


def _window(probs: Probs, room: int, window: int) -> torch.Tensor:
    """The first `room` examples' map over the first `window` queries and keys (each row
    normalised over all keys, as the model computed it).  # [<=room, H, <=window, <=window] on the CPU"""
    wq, wk = min(window, probs.shape[-2]), min(window, probs.shape[-1])
    if isinstance(probs, LazyProbs):
        step = max(1, _CHUNK // max(1, probs.shape[0] * probs.shape[1] * probs.shape[-1]))
        parts = [probs.rows(s, min(wq, s + step))[:room, ..., :wk] for s in range(0, wq, step)]
        return torch.cat(parts, -2).cpu()
    return probs[:room, :, :wq, :wk].detach().float().cpu().clone()


def _auto_micro_batch(inputs: Any, n_heads: int) -> int:
    T = _seq_len(inputs)
    return 0 if T is None else max(1, _MAP_BUDGET // max(1, n_heads * T * T))


def _seq_len(inputs: Any) -> int | None:
    x = inputs if isinstance(inputs, torch.Tensor) else (inputs.get("input_ids") if isinstance(inputs, Mapping) else None)
    if x is None and isinstance(inputs, Mapping):
        x = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
    return int(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else None


def split_batch(inputs: Any, size: int) -> list[Any]:
    """Consecutive slices of `size` examples (all of it when size is 0 or covers the batch)."""
    B = batch_size_of(inputs)
    if size <= 0 or size >= B:
        return [inputs]
    if isinstance(inputs, torch.Tensor):
        return list(inputs.split(size))
    if isinstance(inputs, Mapping):
        return [{k: (v[s:s + size] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == B else v)
                 for k, v in inputs.items()} for s in range(0, B, size)]
    return [inputs]
