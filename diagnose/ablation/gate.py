"""The head gate: the one intervention mechanism (DESIGN.md, mechanism 3).

Each attention site gets a gate that rewrites every head's output right before the
output projection:

    out[b, t, h] = scale[b, h] * head_out[b, t, h] + (1 - scale[b, h]) * fill[b, t, h]

with a per-example, per-head `scale` [B, H] and a replacement `fill` that the ablation method
(methods.py) computes for the batch (None means 0). Closing heads sets their scale to 0
(`close_heads`, the one place that turns "these heads are closed" into scales); batched ablation
replicates a batch K times with a different head at 0 in each replica; gradient importance leaves
scale at 1 with requires_grad and reads d loss / d scale. With no scale set the output is untouched.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, Sequence

import torch

from ..adapters.base import AttentionSite

# observer(head_out) with head_out [B, T, H, D], called on every forward of the site
Observer = Callable[[torch.Tensor], None]
# fill(head_out [B, T, H, D], rows [B] or None, draw) -> what closed heads become, broadcastable to
# [B, T, H, D] (None: 0); set by methods.prepare from the ablation method's entry
GateFill = Callable[[torch.Tensor, "torch.Tensor | None", int], "torch.Tensor | None"]


class Gate:
    """The gate of one site; the engine sets `scale`, `fill`, `rows`, `draw` and `observer` between forwards."""

    def __init__(self, site: AttentionSite):
        self.site = site
        self.scale: torch.Tensor | None = None  # [B, H]; None = every head at 1
        self.fill: GateFill | None = None  # None = replace by zero
        self.rows: torch.Tensor | None = None  # [B] the data set's index of each row, where the caller knows it
        self.draw = 0  # which of a random fill's draws this forward is
        self.observer: Observer | None = None
        self.calls = 0  # forwards that reached the gate: a gate that never fires is an adapter bug

    def __call__(self, head_out: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, T, H, D]
        self.calls += 1
        if self.observer is not None:
            self.observer(head_out)
        if self.scale is None:
            return head_out
        assert self.scale.shape == (head_out.shape[0], head_out.shape[2]), (
            f"gate of {self.site.name!r}: scale {tuple(self.scale.shape)} does not match head output "
            f"{tuple(head_out.shape)} as [B, H]")
        s = self.scale.to(head_out.device, head_out.dtype)[:, None, :, None]  # [B, 1, H, 1], on this layer's device
        fill = None if self.fill is None else self.fill(head_out, self.rows, self.draw)
        if fill is None:
            return head_out * s
        return head_out * s + (1 - s) * fill.to(head_out.device, head_out.dtype)  # fill broadcast to [B, T, H, D]

    def reset(self) -> None:
        self.scale = self.fill = self.rows = self.observer = None
        self.draw = 0


@contextmanager
def gated(sites: Sequence[AttentionSite]) -> Iterator[list[Gate]]:
    """Install one gate per site (through each site's adapter) and remove them all on exit.

    The gates start open (scale None). Every hook lives in the adapters' context managers,
    closed by the ExitStack in reverse order whatever happens, Ctrl-C included.
    """
    gates = [Gate(site) for site in sites]
    with ExitStack() as stack:
        for gate in gates:
            stack.enter_context(gate.site.adapter.intervene(gate.site, gate))
        yield gates


def close_heads(n_heads: Sequence[int], closed: Sequence[tuple[int, int]], batch: int,
                replicas: Sequence[tuple[int, int] | None] = (None,), *, device=None) -> list[torch.Tensor | None]:
    """Per site, the gate scale for K = len(replicas) replicas of a batch of `batch` rows: every
    (site, head) of `closed` shut in all replicas, and replicas[k] (a (site, head), or None) shut in
    replica k too. None for a site where nothing is shut (its gate stays open and untouched).

    Replica-major rows (row k * batch + b), the order of `tensor.repeat(K, ...)`.  # per site [K * B, H]
    """
    K = len(replicas)
    shut: dict[int, list[tuple[int, int]]] = {}  # site -> (replica or -1 for all, head)
    for site, head in closed:
        shut.setdefault(site, []).append((-1, head))
    for k, pair in enumerate(replicas):
        if pair is not None:
            shut.setdefault(pair[0], []).append((k, pair[1]))
    scales: list[torch.Tensor | None] = []
    for site, n in enumerate(n_heads):
        if site not in shut:
            scales.append(None)
            continue
        scale = torch.ones(K, batch, n, device=device)  # [K, B, H]
        for k, head in shut[site]:
            if k < 0:
                scale[:, :, head] = 0.0
            else:
                scale[k, :, head] = 0.0
        scales.append(scale.reshape(K * batch, n))
    return scales
