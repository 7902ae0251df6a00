"""The head gate: the one intervention mechanism (DESIGN.md, mechanism 3).

Each attention site gets a gate that rewrites every head's output right before the
output projection:

    out[b, t, h] = scale[b, h] * head_out[b, t, h] + (1 - scale[b, h]) * fill[h]

with a per-example, per-head `scale` [B, H] and an optional replacement `fill` [H, D]
(None means 0). Zero ablation sets scale to 0; mean ablation sets it to 0 with `fill`
the data-set mean; batched ablation replicates a batch K times with a different head
at 0 in each replica; gradient importance leaves scale at 1 with requires_grad and
reads d loss / d scale. With no scale set (or all ones) the output is untouched.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, Sequence

import torch

from ..adapters.base import AttentionSite

METHODS = ("zero", "mean")  # what a closed head's output becomes: 0, or its mean over the data set

# observer(head_out) with head_out [B, T, H, D], called on every forward of the site
Observer = Callable[[torch.Tensor], None]


class Gate:
    """The gate of one site; the engine sets `scale`, `fill` and `observer` between forwards."""

    def __init__(self, site: AttentionSite):
        self.site = site
        self.scale: torch.Tensor | None = None  # [B, H]; None = every head at 1
        self.fill: torch.Tensor | None = None  # [H, D]; None = replace by zero
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
        if self.fill is None:
            return head_out * s
        return head_out * s + (1 - s) * self.fill.to(head_out.device, head_out.dtype)[None, None]  # fill [1, 1, H, D]

    def reset(self) -> None:
        self.scale = self.fill = self.observer = None


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


def ablation_scale(batch: int, n_heads: int, heads: Sequence[int | None], *, device=None) -> torch.Tensor:
    """Scale for K replicas of a batch: replica k closes head heads[k] (None: a clean replica).

    Replica-major order (row k * batch + b), the order of `tensor.repeat(K, ...)`.  # [K * B, H]
    """
    scale = torch.ones(len(heads), batch, n_heads, device=device)  # [K, B, H]
    for k, h in enumerate(heads):
        if h is not None:
            scale[k, :, h] = 0.0
    return scale.reshape(len(heads) * batch, n_heads)
