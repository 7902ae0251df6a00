"""Memory and speed pre-flight of an exact sweep: how many examples per clean pass (the
micro-batch) and how many heads per ablation forward (the replication).

One probe forward of a single example measures, per example, the largest activation any
module returns, the sum of all leaf-module outputs (what a backward keeps), the logits and
a block's output (what prefix replay hands back). From those the peak of one step is
estimated, and the micro-batch and replication are the largest that

- fit the memory: the free memory (CUDA: torch.cuda.mem_get_info; CPU: available RAM) with
  a safety margin, and the caller's max_memory when given;
- on a CPU, keep the rows of one forward in cache: a replicated forward of K x B sequences
  pushes memory-bound elementwise work (GELU, layer norm, the residual adds) out of the
  last-level cache, and each sequence then costs more than in a plain forward of B, which
  eats what prefix replay saves (issue 14). The largest activation of one layer (a module
  inside the residual blocks) stays under CPU_ROW_BYTES; the output layer's logits, made once
  per forward and not per layer, count towards the memory only. On a GPU more rows per forward
  only fill it better (GPU_ROW_BYTES).

Where the sweep makes logits at the scored positions only (scored.py: IOI scores 1 position in
15), the probe makes them so too: the plan bounds the logits that are made, not a whole-vocabulary
tensor at every position that no pass holds (SmolLM2: 2.9 MB per example, which cut batches of 32
into micro-batches of 2).

The figures are estimates from shapes, not measurements of the allocator; SAFETY leaves room
for what they miss (the weights' own temporaries, the allocator's slack).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..adapters import hooks
from ..adapters.base import AttentionSite
from .._numbers import number
from ..errors import ConfigError
from ..objectives import batch_size_of, call_model, logits_of, targets_for
from .prefix import take_rows
from .batches import Batches
from .scored import ScoredOnly, positions

CPU_ROW_BYTES = 8 * 2 ** 20  # largest activation of one forward on a CPU: a quarter of a 32 MB L3
GPU_ROW_BYTES = 2 ** 30  # on a GPU, the same bound only keeps one forward's activations modest
SAFETY = 0.7  # use at most this share of the free memory

MAX_SIZE = 2 ** 60  # bytes: an exabyte
_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kb": 2 ** 10, "kib": 2 ** 10, "m": 2 ** 20, "mb": 2 ** 20, "mib": 2 ** 20,
          "g": 2 ** 30, "gb": 2 ** 30, "gib": 2 ** 30, "t": 2 ** 40, "tb": 2 ** 40, "tib": 2 ** 40}


def parse_size(value: int | float | str | None, name: str = "max_memory") -> int | None:
    """Bytes from 2000000, '512MB', '1.5G', '4GiB' (powers of 1024); None stays None. name: how the
    caller's user spelled the setting (`--max-memory`), for the message."""
    if value is None:
        return None
    if number(value) is not None:
        size = number(value)
    elif isinstance(value, int) and not isinstance(value, bool):  # more than a float holds
        size = math.inf
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{name} {_short(value)} is not a size; write e.g. 512MB, 4GB or a number of bytes")
        size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not size >= 1:
        raise ConfigError(f"{name} must be a positive size, got {_short(value)}")
    if size > MAX_SIZE:  # 400 digits parse as infinity: no machine has that, and int(inf) would raise
        raise ConfigError(f"{name} {_short(value)} is more memory than any machine has; write e.g. 512MB, "
                          "4GB or a number of bytes")
    return int(size)


def _short(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= 24 else text[:12] + "..." + text[-6:])


@dataclass(frozen=True)
class Footprint:
    """Bytes one example costs in a forward, measured by a probe."""

    largest: int  # the largest single module output
    saved: int  # all leaf-module outputs together (about what a backward keeps)
    logits: int
    hidden: int  # one residual block's output
    n_blocks: int
    layer: int = 0  # the largest output of a module inside the residual blocks (0: none found)

    def clean_bytes(self, b: int) -> int:
        """Peak of a clean pass with d loss / d gate on b examples: the kept activations (x 2 for the
        elementwise temporaries inside modules), the logits, their softmax and gradient."""
        return b * (2 * self.saved + 4 * self.logits)

    def ablation_bytes(self, k: int, b: int) -> int:
        """Peak of one ablation forward of k replicas of b examples, beside the clean batch it needs."""
        held = b * (3 * self.logits + self.n_blocks * self.hidden)  # clean logits, log-probs, recorded outputs
        return held + k * b * (4 * self.largest + 2 * self.hidden + 4 * self.logits)

    def step_bytes(self, k: int, b: int) -> int:
        return max(self.clean_bytes(b), self.ablation_bytes(k, b))

    def row_bytes(self) -> int:
        """What the cache bound reads: one layer's largest activation (the largest of all where no block is known)."""
        return self.layer or self.largest


@dataclass(frozen=True)
class Plan:
    """What the pre-flight chose, and why."""

    micro_batch: int  # examples per clean pass and per replica
    replication: int  # heads (replicas) per ablation forward
    batch: int  # the largest batch passed
    estimated_step_bytes: int
    free_bytes: int | None  # None: unknown (then only max_memory bounds the plan)
    max_memory_bytes: int | None
    limited_by: str  # "batch" (nothing to cut), "cache" (CPU speed), "gpu" (GPU_ROW_BYTES) or "memory"
    device: str

    def to_json(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch, "replication": self.replication, "batch": self.batch,
                "estimated_step_bytes": self.estimated_step_bytes, "free_bytes": self.free_bytes,
                "max_memory_bytes": self.max_memory_bytes, "limited_by": self.limited_by, "device": self.device}

    def describe(self) -> str:
        """One line for the progress output."""
        free = "" if self.free_bytes is None else f" of {_mb(self.free_bytes)} free"
        cap = "" if self.max_memory_bytes is None else f", max {_mb(self.max_memory_bytes)}"
        return (f"micro-batch {self.micro_batch} of {self.batch}, {self.replication} head(s) per forward, "
                f"~{_mb(self.estimated_step_bytes)} per step{free}{cap} (by {self.limited_by})")


def plan_sweep(model: nn.Module, sites: Sequence[AttentionSite], batches: Sequence[tuple[Any, Any]], *,
               max_memory: int | str | None = None, free: int | None | str = "measure",
               scored: ScoredOnly | None = None, task: str | None = None) -> Plan:
    """Probe one example, then choose the micro-batch and replication (see the module docstring).

    free: the free bytes to plan against ("measure": ask the device). A max_memory below what one
    example needs raises ConfigError; without one, a plan that does not fit runs one example at a time.
    scored and task: the sweep's cut of the logits to the scored positions (scored.py), checked here on
    the widest batch's first example and probed as the passes will make them.
    """
    cap_user = parse_size(max_memory)
    batch = max(batch_size_of(x) for x, _ in batches)
    widest, labels = max(batches, key=lambda pair: _tokens_per_example(pair[0]))
    one = take_rows(widest, 0, 1, batch_size_of(widest))
    index = _scored_index(model, sites, batches, scored, task, one, labels)
    fp = footprint(model, sites, one, scored=scored if index is not None else None, index=index)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    free_bytes = free_memory(device) if free == "measure" else free
    caps = [c for c in (None if free_bytes is None else int(free_bytes * SAFETY), cap_user) if c is not None]
    cap = min(caps) if caps else None
    if cap_user is not None and fp.step_bytes(1, 1) > cap_user:
        raise ConfigError(f"max_memory {_mb(cap_user)} is below the ~{_mb(fp.step_bytes(1, 1))} one example needs "
                          "in one step (estimated); raise it")
    rows = max(1, (CPU_ROW_BYTES if device.type == "cpu" else GPU_ROW_BYTES) // max(fp.row_bytes(), 1))
    n_heads = max((s.n_heads for s in sites), default=1)
    b, k = _choose(fp, batch, n_heads, rows, cap)
    if (b, k) != _choose(fp, batch, n_heads, rows, None):
        limited = "memory"
    elif b == batch and k == n_heads:
        limited = "batch"
    else:
        limited = "cache" if device.type == "cpu" else "gpu"
    return Plan(micro_batch=b, replication=k, batch=batch, estimated_step_bytes=fp.step_bytes(k, b),
                free_bytes=free_bytes, max_memory_bytes=cap_user, limited_by=limited, device=str(device))


def footprint(model: nn.Module, sites: Sequence[AttentionSite], example: Any, *, scored: ScoredOnly | None = None,
              index: torch.Tensor | None = None) -> Footprint:
    """Per-example bytes of one forward of `example` (a batch of one), every module hooked; with `scored`,
    the logits made at positions `index` [1, S] only, as the sweep makes them."""
    outs: list[int] = []
    leaf: list[int] = []
    block_list = [m for _, m in (sites[0].adapter.blocks(model) if sites else [])]
    blocks = {id(m) for m in block_list}
    inside = {id(m) for b in block_list for m in b.modules()}
    hidden: list[int] = []
    layer: list[int] = []

    def hook(module: nn.Module, _args, out) -> None:
        n = _nbytes(out)
        outs.append(n)
        if not any(True for _ in module.children()):
            leaf.append(n)
        if id(module) in blocks:
            hidden.append(n)
        if id(module) in inside:
            layer.append(n)

    regs = [lambda m=m: m.register_forward_hook(hook) for m in model.modules() if m is not model]
    with torch.no_grad(), hooks(*regs), (scored.at(index) if scored is not None else _nothing()):
        logits = logits_of(call_model(model, example))
    n_logits = logits.numel() * max(logits.element_size(), 4)  # scored in float32
    return Footprint(largest=max([*outs, n_logits]), saved=sum(leaf) + n_logits, logits=n_logits,
                     hidden=max(hidden, default=0), n_blocks=len(blocks), layer=max(layer, default=0))


def _scored_index(model: nn.Module, sites: Sequence[AttentionSite], batches: Sequence[tuple[Any, Any]],
                  scored: ScoredOnly | None, task: str | None, one: Any, labels: Any) -> torch.Tensor | None:
    """The probe's scored positions [1, S] (S: the most any example has) when every batch's logits will be
    cut to them and the cut holds on `one` (the widest batch's first example, labels its batch's); else None."""
    if scored is None or not scored.on or task is None:
        return None
    cuts = [positions(targets_for(task, x, y)) for x, y in getattr(batches, "pairs", batches)]
    if any(c is None for c in cuts):
        return None
    mine = positions(targets_for(task, one, None if labels is None else take_rows(labels, 0, 1, len(labels))))
    if mine is None or not scored.check(model, sites, one, mine[0]):
        return None
    return torch.arange(max(c[0].shape[1] for c in cuts))[None]  # [1, S]


def free_memory(device: torch.device) -> int | None:
    """Free bytes on `device`: CUDA's free memory plus what torch's cache holds unused; on a CPU
    the available RAM (psutil, else /proc/meminfo); None where neither can be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _choose(fp: Footprint, batch: int, n_heads: int, rows: int, cap: int | None) -> tuple[int, int]:
    """(micro-batch, replication): the largest within `rows` sequences per forward and `cap` bytes."""
    b = _largest(batch, lambda b: b <= rows and (cap is None or fp.step_bytes(1, b) <= cap))
    k = _largest(n_heads, lambda k: k * b <= rows and (cap is None or fp.step_bytes(k, b) <= cap))
    return b, k


def _largest(n: int, ok) -> int:
    """The largest m in 1..n with ok(m) (ok is monotone: true up to some m); 1 if none."""
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _tokens_per_example(inputs: Any) -> int:
    """Elements per example over the input tensors (the widest batch is probed)."""
    b = batch_size_of(inputs)
    tensors = inputs.values() if isinstance(inputs, dict) else [inputs]
    return sum(t.numel() // max(b, 1) for t in tensors if isinstance(t, torch.Tensor))


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    if hasattr(obj, "to_tuple"):  # transformers' ModelOutput
        return sum(_nbytes(o) for o in obj.to_tuple())
    return 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _mb(n: int) -> str:
    """A size as a person reads it: GB, MB, KB or bytes (1KB is not "0 MB")."""
    if n >= 2 ** 30:
        return f"{n / 2 ** 30:.1f} GB"
    if n >= 2 ** 20:
        return f"{n / 2 ** 20:.0f} MB"
    return f"{n / 2 ** 10:.0f} KB" if n >= 2 ** 10 else f"{n} bytes"


def micro_batches(batches: Sequence[tuple[Any, Any]], size: int) -> Sequence[tuple[Any, Any]]:
    """The (inputs, labels) batches cut into pieces of at most `size` examples, in order. Batches
    that move to the device as read (`Batches`) are cut where they are and still move one at a time."""
    if isinstance(batches, Batches):
        return Batches(micro_batches(batches.pairs, size), batches.device, batches.last_position)
    out = []
    for inputs, labels in batches:
        B = batch_size_of(inputs)
        for start in range(0, B, size):
            out.append((take_rows(inputs, start, start + size, B), take_rows(labels, start, start + size, B)))
    return out
