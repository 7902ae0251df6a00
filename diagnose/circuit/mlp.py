"""MLP nodes: where each layer's MLP reads and writes, as its adapter declares it, and the gate on its write.

The adapter's `mlp(model, site)` (adapters/readout.py) names the module of the MLP in a site's layer: its
first input is what the MLP reads, its one output what it adds to the stream. One traced forward finds
the norm in front of it (as for the heads' projections, wiring.py) and checks that it runs after the
layer's attention (a sequential block: a parallel one would read the stream before the heads wrote) and
returns one tensor shaped as its input. An MLP edge then moves its input by the sender's change through
that norm, frozen at its clean input:

    change_in[MLP l] = norm_l.change(-(write_s - fill_s))      # [B, T, d]

and an MLP's own write is its output minus the method's fill for it. The fill is the head gate's: the
MLP's output is one "head" as wide as the stream ([B, T, 1, d]) behind a Gate (ablation/gate.py), so
zero, mean and resample (the method registry) fill an MLP as they fill a head, from the same data pass.
Where the adapter declares no MLP, or one of them fails a check, the nodes are the heads only and
`note` says why, once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from ..adapters import hooks
from ..adapters.base import AttentionSite
from ..adapters.norms import NormForm
from ..adapters.readout import mlp_of
from ..ablation.gate import Gate
from ..errors import ConfigError

NOT_MEASURED = "MLP nodes were not measured"


@dataclass(frozen=True, eq=False)
class MlpSite:
    """A layer's MLP as the gate and the ablation methods see a site: one head as wide as the stream."""

    layer: int
    name: str
    head_dim: int  # d, the width of the stream it writes
    module: nn.Module = field(repr=False)
    adapter: Any = field(repr=False)
    n_heads: int = 1
    n_kv_heads: None = None
    application: None = None


@dataclass(frozen=True)
class Mlp:
    """One MLP node: its site, and the norm in front of it (its scale frozen at its clean input)."""

    site: MlpSite
    norm: nn.Module
    form: NormForm


def find_mlps(model: nn.Module, sites: Sequence[AttentionSite], calls, norm_in_front) -> tuple[tuple[Mlp, ...],
                                                                                               str | None]:
    """Each layer's MLP node, or () and the one line saying why they are not measured. `norm_in_front(name,
    adapter, module, calls)` is wiring's search for the norm whose output a module reads."""
    adapter = sites[0].adapter
    try:
        found = [_mlp(model, site, calls, norm_in_front) for site in sites]
    except ConfigError as e:
        return (), f"{NOT_MEASURED}: {e}; the circuit's nodes are its heads"
    if len({id(m.site.module) for m in found}) != len(found):
        return (), f"{NOT_MEASURED}: the {adapter.family} adapter names one MLP for several layers"
    return tuple(found), None


def _mlp(model: nn.Module, site: AttentionSite, calls, norm_in_front) -> Mlp:
    module = mlp_of(site.adapter, model, site)
    name = next((n for n, m in model.named_modules() if m is module), type(module).__name__)
    mine = [c for c in calls if c.module is module]
    attn = [c for c in calls if c.module is site.module]
    if len(mine) != 1 or not mine[0].inputs:
        raise ConfigError(f"{name} ran {len(mine)} times in one forward, not once")
    call = mine[0]
    if attn and call.begin < attn[-1].end:
        raise ConfigError(f"{name} starts before {site.name} has written (a parallel block)")
    x = call.inputs[0]
    if len(call.outputs) != 1 or call.outputs[0].shape != x.shape or x.dim() != 3:
        raise ConfigError(f"{name} returns {len(call.outputs)} tensors, not one write shaped as its input")
    norm, form = norm_in_front(name, site.adapter, module, calls)
    if norm is None:
        raise ConfigError(f"no norm was found in front of {name}")
    return Mlp(MlpSite(site.layer, name, int(x.shape[-1]), module, site.adapter), norm, form)


@contextmanager
def mlp_gated(mlps: Sequence[Mlp]) -> Iterator[list[Gate]]:
    """One head gate per MLP node on its output viewed as [B, T, 1, d], removed on exit whatever happens."""
    gates = [Gate(m.site) for m in mlps]

    def gate_on(gate: Gate):
        def run(_module, _args, out: torch.Tensor) -> torch.Tensor:
            head = out[:, :, None, :]  # [B, T, 1, d]
            res = gate(head)
            return out if res is head else res[:, :, 0, :]
        return run

    with hooks(*[lambda m=m, g=g: m.site.module.register_forward_hook(gate_on(g)) for m, g in zip(mlps, gates)]):
        yield gates
