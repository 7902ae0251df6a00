"""The ranks of a torch.distributed process group, as the analyses need them: which shard of
the batches is mine, gather everyone's results, and fail together instead of hanging.

One code path for NCCL (GPUs) and gloo (CPUs): only picklable Python objects travel
(`all_gather_object`), a few times per analysis, so the backend's speed does not matter.

Hangs: a collective waits for every rank. Local work runs inside `Ranks.run_local`: a rank
whose work fails sends its error in place of the next collective's payload and raises it;
the others raise a `DistributedError` naming it at whichever collective they are in. What cannot be caught (a killed process, a segfault) is torchrun's to handle: it
stops the other workers when one exits; a hand-made process group waits for its `timeout`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

import torch

from .errors import ConfigError, DistributedError

T = TypeVar("T")
_TOLD = "_diagnose_ranks_told"  # set on an exception the other ranks already know about (DistributedError)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the group: rank `rank` of `world` (world 1: no group in use)."""

    rank: int = 0
    world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints and writes files."""
        return self.rank == 0

    def shard(self, n: int) -> range:
        """My contiguous share of n items (sizes differ by at most one; rank 0 holds the first items,
        so the examples a report keeps are rank 0's)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def gather(self, obj: T) -> list[T]:
        """Every rank's obj, in rank order, on every rank; raises DistributedError on every rank when
        another rank sent a failure instead (see `run_local`)."""
        if not self.active:
            return [obj]
        parts = self._exchange(("ok", obj))
        bad = next(((r, p[1]) for r, p in enumerate(parts) if p[0] == "failed"), None)
        if bad is not None:
            raise DistributedError(f"rank {bad[0]} of {self.world} failed while {bad[1]}")
        return [p[1] for p in parts]

    def add_up(self, tensors: Sequence[torch.Tensor | None], numbers: Sequence[float],
               device: torch.device | None = None) -> tuple[list[torch.Tensor | None], list[float]]:
        """Element-wise sums over the ranks, added in rank order so every rank gets the same bits
        (None: nothing on that rank). The sums land on `device` (default: the CPU)."""
        if not self.active:
            return list(tensors), list(numbers)
        parts = self.gather(([None if t is None else t.detach().cpu() for t in tensors], [float(x) for x in numbers]))
        out: list[torch.Tensor | None] = []
        for i in range(len(tensors)):
            got = [ts[i] for ts, _ in parts if ts[i] is not None]
            total = None
            for t in got:
                total = t if total is None else total + t
            out.append(None if total is None else total.to(device) if device is not None else total)
        return out, [sum(ns[i] for _, ns in parts) for i in range(len(numbers))]

    def run_local(self, what: str, fn: Callable[[], T]) -> T:
        """fn() on this rank, then one exchange that tells every rank whether any failed: a failing rank
        sends its error in place of the next collective's payload and raises it; the others raise
        DistributedError at whichever collective they are in. So every rank takes part in the same
        number of collectives and none is left waiting."""
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 -- raised again once the others are told
            if self.active and not getattr(exc, _TOLD, False):
                setattr(exc, _TOLD, True)
                self._exchange(("failed", f"{what}: {type(exc).__name__}: {exc}"))
            raise
        self.gather(None)
        return value

    def _exchange(self, payload: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, payload)
        return out


def ranks(distributed: bool | None = None) -> Ranks:
    """The ranks to use: None uses an initialised process group when there is one (world size > 1),
    True requires one, False runs alone even inside a group."""
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed is True and not ready:
        raise ConfigError("distributed=True needs an initialised torch.distributed process group "
                          "(torch.distributed.init_process_group, or start under torchrun)")
    if distributed is False or not ready:
        return Ranks()
    return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size())


def init_from_env() -> tuple[Ranks, torch.device | None]:
    """Under torchrun (WORLD_SIZE > 1 in the environment) join the process group: NCCL with one GPU
    per local rank when CUDA is there, gloo on CPUs. Returns the ranks and the device to use
    (None: leave the model where it is)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return Ranks(), None
    device = None
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            torch.distributed.init_process_group("nccl")
        else:
            torch.distributed.init_process_group("gloo")
    elif torch.distributed.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return ranks(None), device


def leave() -> None:
    """Destroy the process group this process joined (at exit, after the last collective)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def pick(items: Sequence[T], r: Ranks) -> Sequence[T]:
    """My shard of a sequence (the whole of it when alone)."""
    s = r.shard(len(items))
    return items[s.start:s.stop]


SAID_WAIT = 60.0  # seconds a rank other than 0 waits, after an error, for rank 0 to have said it


def say_on_rank0(say: Callable[[], None], wait: float = SAID_WAIT) -> None:
    """An error every rank of a torchrun launch met: rank 0 calls say() and marks the group's store;
    the others print nothing and return only once that mark is there (or after `wait` seconds).
    torchrun stops every worker as soon as one exits with an error, so a rank that left first
    could cut rank 0 off before its line. Then the process group, kept up for this, is left.
    The store: the process group's, else the one torchrun's agent serves (torch >= 2.5); with
    neither, say() runs on rank 0 and the others return at once. Never raises."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1") or 1), os.environ.get("RANK", "0")
    if world <= 1 or rank == "0":
        say()
    if world <= 1:
        return
    try:
        store = _store(wait)
        key = f"diagnose/error-said/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if store is not None and rank == "0":
            store.set(key, "1")
        elif store is not None:
            deadline = time.monotonic() + wait
            while not store.check([key]) and time.monotonic() < deadline:  # polled: a timed-out wait logs from C++
                time.sleep(0.05)
    except Exception:  # noqa: BLE001 -- rank 0 died or the store is gone: nothing left to wait for
        pass
    finally:
        leave()


def _store(wait: float):
    """The key-value store every rank reaches: the process group's when one is joined, else a client
    of the store torchrun's agent serves at MASTER_ADDR:MASTER_PORT; None: neither."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.distributed_c10d._get_default_store()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not addr or not (port or "").isdigit():
        return None  # before torch 2.5 rank 0's process group serves the store: nothing there yet
    return torch.distributed.TCPStore(addr, int(port), is_master=False,
                                      timeout=timedelta(seconds=max(1.0, min(wait, 10.0))))
