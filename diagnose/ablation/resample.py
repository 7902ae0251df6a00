"""Resample ablation: a closed head's output on each example becomes that head's output on another
example of the same data (Chan et al. 2022, causal scrubbing; Heimersheim & Nanda 2024), one donor per
(example, draw), the outcomes averaged over the draws by the sweep.

Unlike zero (and less so mean) ablation it keeps later layers on the distribution they were trained on,
so a head whose output is a large constant is not called vital merely because 0 is off-distribution.

How the state is built (one registry entry, `prepare` + `fill`; methods.py):
- the donors: a seeded generator picks a pool of at most POOL examples from the whole data set (so the
  recorded outputs stay small: POOL x length x heads x width per layer, not the data set) and, for every
  (example, draw), one donor in that pool other than the example itself. The choice depends only on the
  seed, the data set's size and the draws, so every rank of torchrun picks the same donors;
- one forward over the data records the pool members' head outputs per site, each rank writing its own
  members into zero-filled buffers that the ranks add up (a gather): torchrun equals one process;
- sequence lengths: the recipient's position t gets the donor's position t where the donor has a real
  token there, else the donor's own mean over its real tokens (padding and a longer recipient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch

    from .methods import DataPass

POOL = 64  # donors recorded per data set: memory POOL x T x H x D per layer, whatever the data's size
MAX_DRAWS = 1000  # draws per example at most: each is one more forward per closed head (docs/heads.md)
MAX_SEED = 2 ** 63 - 1  # torch.Generator's seeds are 64-bit; the bootstrap's numpy ones likewise
DRAWS = 2  # default donors per example: the sweep's ablations cost about this many zero sweeps


@dataclass
class Donors:
    """The recorded pool: per site the donors' outputs [P, L, H, D] (beyond a donor's real tokens: its
    mean) and means [P, H, D]; `table` [N, draws] the pool index of each (example, draw)'s donor."""

    outputs: list  # per site [P, L, H, D]
    means: list  # per site [P, H, D]
    table: "torch.Tensor"  # [N, draws], pool indices
    pool: "torch.Tensor"  # [P] the data set's index of each pool member


def check_donor_table(n: int, draws: int, max_memory: int | None = None) -> None:
    """ConfigError, before anything is allocated, when the donor table (int64 [n, draws]) needs more than
    max_memory (bytes; None: no cap) or the free memory; the sweep checks it before any work (engine.py)."""
    import torch

    from .plan import SAFETY, _mb, free_memory

    table_bytes, free = n * draws * 8, free_memory(torch.device("cpu"))
    for limit, what, fix in ((max_memory, "max_memory", "lower --draws or raise --max-memory"),
                             (None if free is None else int(free * SAFETY), "the free memory", "lower --draws")):
        if limit is not None and table_bytes > limit:
            raise ConfigError(f"resample's donor table for {n:,} examples x {draws} draws needs {_mb(table_bytes)}, "
                              f"more than {what} ({_mb(limit)}); {fix}")


def choose_donors(n: int, draws: int, seed: int, pool_size: int = POOL) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(pool [P] data set indices, table [n, draws] pool indices): never an example's own output."""
    import torch

    if n < 2:
        raise ConfigError("resample ablation needs at least 2 examples (each takes its donor from another)")
    check_donor_table(n, draws)
    g = torch.Generator().manual_seed(int(seed))
    pool = torch.randperm(n, generator=g)[:min(n, pool_size)]  # [P]
    P = pool.numel()
    table = torch.randint(0, P, (n, draws), generator=g)  # [n, draws]
    own = pool[table] == torch.arange(n)[:, None]  # the example drew itself: take the next pool member
    table[own] = (table[own] + 1) % P
    return pool, table


def resample_outputs(data_pass: "DataPass") -> Donors:
    """The method's data pass: pick the donors, then record their head outputs (see the module docstring)."""
    import torch

    from ..objectives import batch_size_of
    from .batches import padding_mask
    from .observe import observe_heads
    from .steps import indexed

    sweep, reduce = data_pass.sweep, data_pass.reduce or (lambda ts, ns: (list(ts), list(ns)))
    batches = list(data_pass.batches)
    _, (n,) = reduce([], [float(sum(batch_size_of(x) for x, _ in batches))])
    pool, table = choose_donors(int(n), int(data_pass.draws or DRAWS), data_pass.seed)
    where = {int(row): p for p, row in enumerate(pool.tolist())}  # data set index -> pool index
    lengths = torch.zeros(pool.numel())  # [P] each member's padded length, from the rank that holds it
    for inputs, _, rows in indexed(batches, data_pass.first):
        T = _length(inputs)
        for row in rows.tolist():
            if row in where:
                lengths[where[row]] = T
    (lengths,), _ = reduce([lengths], [])
    L = int(lengths.max())
    outputs: list[Any] = [None] * len(sweep.sites)
    means: list[Any] = [None] * len(sweep.sites)
    now: dict[str, Any] = {}

    def observer(s: int):
        def observe(head_out: torch.Tensor) -> None:  # [B, T, H, D]
            x = head_out.detach().float()
            B, T, H, D = x.shape
            if outputs[s] is None:
                outputs[s] = torch.zeros(pool.numel(), L, H, D, device=x.device)
                means[s] = torch.zeros(pool.numel(), H, D, device=x.device)
            mask = now["mask"]
            real = (mask.to(x.device, x.dtype) if mask is not None and tuple(mask.shape) == (B, T)
                    else torch.ones(B, T, device=x.device))  # [B, T]
            for b, p in now["members"]:
                w = real[b][:, None, None]  # [T, 1, 1]
                mean = (x[b] * w).sum(0) / w.sum().clamp(min=1.0)  # [H, D]
                means[s][p] = mean
                outputs[s][p] = mean  # every position starts at the mean; the real ones are overwritten
                t = min(T, L)  # a model that adds positions: keep the first L
                outputs[s][p, :t] = torch.where(w[:t] > 0, x[b, :t], mean)
        return observe

    def before(inputs: Any, rows: torch.Tensor) -> None:
        now["mask"] = padding_mask(inputs)
        now["members"] = [(b, where[row]) for b, row in enumerate(rows.tolist()) if row in where]

    observe_heads(sweep, batches, data_pass.first, observer, before, data_pass.tick)
    gathered, _ = reduce(outputs + means, [])  # a rank that held no batch has None here: the peers' outputs
    k = len(outputs)
    for s, out in enumerate(gathered[:k]):  # after the reduction, as mean's data pass: no rank saw the site
        if out is None:
            sweep.silent(s)
    device = next((t.device for t in outputs if t is not None), gathered[0].device if gathered else None)
    return Donors([t.to(device) for t in gathered[:k]], [t.to(device) for t in gathered[k:]],
                  table.to(device), pool)


def resample_fill(state: Donors, site: int, head_out, rows, draw):
    """Each row's donor output for this draw, cut or extended to the batch's length.  # [B, T, H, D]"""
    import torch

    if rows is None:
        raise ConfigError("resample ablation needs each row's index in the data set; this path does not give it")
    donors = state.table[rows.to(state.table.device), draw]  # [B] pool indices
    out = state.outputs[site][donors]  # [B, L, H, D]
    T, L = head_out.shape[1], out.shape[1]
    if T <= L:
        return out[:, :T]
    tail = state.means[site][donors][:, None].expand(-1, T - L, -1, -1)  # [B, T - L, H, D]
    return torch.cat([out, tail], dim=1)


def _length(inputs: Any) -> int:
    """The padded length of a batch (its token dimension)."""
    x = inputs["input_ids"] if isinstance(inputs, dict) and "input_ids" in inputs else inputs
    if isinstance(x, dict):
        x = next(iter(x.values()))
    return int(x.shape[1]) if getattr(x, "dim", lambda: 0)() >= 2 else 1
