"""Where each edge of a circuit starts and ends in the model, as the adapters declare it.

A sender's write is its slice of the output projection (ablation/direct.head_weights). A receiver's
q, k or v input is its block of D output features of a query/key/value projection, which the family's
projection layout names (adapters/layout.py): head h's features h*D:(h+1)*D of each part of a BLOCKED
[q; k; v] projection (GPT-2, the reference model), of its own SEPARATE projection (LLaMA, BERT), or
3hD + pD of an INTERLEAVED one. The norm in front of the projections is the module whose output one
traced forward feeds them (adapters/_stream.trace_calls); its scale is frozen at its clean input, as
the direct effects freeze the final norm, so an edge's change is linear in the sender's change:

    change_in[r, p, h] = W_in[p, h] . norm_r.change(-W_O[s] (out_s - fill_s))   # [B, T, D]

The direct path of a pre-norm model, the final norm, is the adapter's (readout.final_norm); a model
whose heads reach the output through more than that one norm (post-norm) has no circuits here yet.
Code whose adapter declares no path (nanoGPT-style models under the generic adapter) gets it from the
traced residual stream the direct effects use (adapters.stream_plan): the one norm called after its
layers is the final norm, and each receiver's input norm must sit in its own layer (a pre-norm stream;
a post-norm layer reads the previous layer's norm, and is refused). Where the adapter declares each
layer's MLP, the MLPs are nodes too (mlp.py), their input norms found the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..adapters import stream_plan, trace_calls
from ..adapters.base import AttentionSite
from ..adapters.layout import BLOCKED, INTERLEAVED, layout_of
from ..adapters.norms import NormForm, declared, infer
from ..adapters.readout import residual_path
from ..ablation.direct import head_weights, norm_form
from ..errors import ConfigError
from .edges import PARTS
from .mlp import NOT_MEASURED, Mlp, find_mlps

_WHY = "so its circuit is not measured"


@dataclass(frozen=True)
class Input:
    """One query/key/value projection of a receiver site: its output feature block j (D wide) is the
    input `slices[j]` = (part, head) of one receiver head."""

    module: nn.Module
    weight: torch.Tensor  # [d_in, F], F = len(slices) * D
    slices: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Site:
    """One attention layer as a sender (write [H, D, d]) and a receiver (its inputs and their norm)."""

    write: torch.Tensor  # [H, D, d]
    inputs: tuple[Input, ...]
    norm: nn.Module | None  # in front of the projections (None: they read the residual stream itself)
    form: NormForm | None


@dataclass(frozen=True)
class Wiring:
    """Every site's ends, the final norm (the output edges' path), and the MLP nodes (none: `mlp_note` says
    why)."""

    sites: tuple[Site, ...]
    final: nn.Module
    final_form: NormForm
    head_dim: tuple[int, ...]
    mlps: tuple[Mlp, ...] = ()
    mlp_note: str | None = None

    @property
    def norms(self) -> list[nn.Module]:
        """Each norm whose clean input the edges freeze, once."""
        found = [s.norm for s in self.sites if s.norm is not None] + [m.norm for m in self.mlps] + [self.final]
        return list({id(n): n for n in found}.values())

    def form_of(self, norm: nn.Module) -> NormForm:
        if norm is self.final:
            return self.final_form
        return next(x.form for x in (*self.sites, *self.mlps) if x.norm is norm)


def wiring(model: nn.Module, sites: Sequence[AttentionSite], example: Any, mlps: bool = True) -> Wiring:
    """The wiring of `sites` (with the MLP nodes the adapter declares, unless `mlps` is False); ConfigError
    (one line) where the adapter declares too little for the heads."""
    if not sites:
        raise ConfigError(f"the model has no attention sites, {_WHY}")
    model = getattr(model, "_orig_mod", model)
    adapter = sites[0].adapter
    traced = not (hasattr(adapter, "residual_path") or hasattr(adapter, "final_norm"))
    final, form, stack = _traced_final(model, sites, example) if traced else _declared_final(model, sites)
    calls = trace_calls(model, example)
    built = tuple(_site(site, calls) for site in sites)
    if stack is not None:
        _own_layers({m: n for n, m in model.named_modules()}, sites, built, stack)
    found, note = find_mlps(model, sites, calls, norm_in_front) if mlps else \
        ((), f"{NOT_MEASURED}: they were not asked for (mlps=False, --no-mlps)")
    return Wiring(built, final, form, tuple(s.head_dim for s in sites), found, note)


def _declared_final(model: nn.Module, sites: Sequence[AttentionSite]) -> tuple[nn.Module, NormForm, None]:
    path = residual_path(sites[0].adapter, model, sites[0])
    if len(path.norms) != 1 or path.output is not path.norms[0]:
        raise ConfigError("a head reaches this model's output through more than its final norm (post-norm), "
                          f"{_WHY}: circuits need a pre-norm residual stream")
    return path.norms[0], norm_form(sites[0].adapter, path.norms[0]), None


def _traced_final(model: nn.Module, sites: Sequence[AttentionSite], example: Any) -> tuple[nn.Module, NormForm, str]:
    """The one norm a traced forward calls after the layers, its form, and the layers' stack name."""
    plan = stream_plan(model, sites, example)
    names = {m: n for n, m in model.named_modules()}
    finals = [(n, f) for n, f in zip(plan.norms, plan.forms) if not _under(names.get(n, ""), plan.stack)]
    if len(finals) != 1:
        raise ConfigError(f"a traced forward finds {len(finals)} norms after the layers of {plan.stack or 'the model'}"
                          f", not one final norm, {_WHY}: circuits need a pre-norm residual stream")
    return finals[0][0], finals[0][1], plan.stack


def _own_layers(names: dict[nn.Module, str], sites: Sequence[AttentionSite], built: Sequence["Site"],
                stack: str) -> None:
    """Each receiver's input norm (named by `names`) sits in the receiver's own layer of `stack` (pre-norm);
    ConfigError if not."""
    depth = len(stack.split(".")) + 1 if stack else 1
    for site, wired in zip(sites, built):
        layer = site.name.split("#")[0].split(".")[:depth]
        if wired.norm is not None and names.get(wired.norm, "").split(".")[:depth] != layer:
            raise ConfigError(f"{site.name} reads {names.get(wired.norm)}, a norm outside its own layer (post-norm), "
                              f"{_WHY}: circuits need a pre-norm residual stream")


def _under(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _site(site: AttentionSite, calls) -> Site:
    if site.application is not None:
        raise ConfigError(f"{site.name}: its attention module is shared across depths, {_WHY}")
    inputs = _inputs(site)
    norm, form = _input_norm(site, inputs[0].module, calls)
    return Site(head_weights(site), inputs, norm, form)


def _inputs(site: AttentionSite) -> tuple[Input, ...]:
    """The site's projections and which (part, head) each D-wide feature block of theirs is."""
    lay = layout_of(site)
    H, D = site.n_heads, site.head_dim
    kv = int(site.n_kv_heads or H)
    out = []
    for i, proj in enumerate(lay.inputs):
        module = reduce(getattr, proj.path.split("."), site.module)
        if proj.kind == BLOCKED:
            slices = tuple((p, h) for p in PARTS for h in range(H))
        elif proj.kind == INTERLEAVED:
            slices = tuple((p, h) for h in range(H) for p in PARTS)
        else:
            if len(lay.inputs) != 3:
                raise ConfigError(f"{site.name}: {len(lay.inputs)} separate projections, not q, k and v, {_WHY}")
            slices = tuple((PARTS[i], h) for h in range(kv if PARTS[i] != "q" else H))
        w = module.weight.detach()
        w = w if lay.conv1d else w.t()  # [in, out]
        if w.shape[1] != len(slices) * D:
            raise ConfigError(f"{site.name}.{proj.path}: {w.shape[1]} output features, not {len(slices)} x {D}, {_WHY}")
        out.append(Input(module, w, slices))
    return tuple(out)


def _input_norm(site: AttentionSite, proj: nn.Module, calls) -> tuple[nn.Module | None, NormForm | None]:
    """The norm whose output the site's first projection reads in the traced forward, and its form."""
    first = next((c for c in calls if c.module is proj), None)
    if first is None or not first.inputs:
        raise ConfigError(f"{site.name}: its query/key/value projection was not called as a module in a forward, "
                          f"{_WHY}")
    norm, form = norm_in_front(site.name, site.adapter, proj, calls, container=site.module)
    if norm is not None:
        return norm, form
    if any(first.inputs[0] is c.inputs[0] for c in calls if c.module is site.module and c.inputs):
        return None, None  # the attention reads its input unnormed: the residual stream itself
    raise ConfigError(f"{site.name}: no norm was found in front of its projections, {_WHY}")


def norm_in_front(name: str, adapter: Any, module: nn.Module, calls, container: nn.Module | None = None
                  ) -> tuple[nn.Module | None, NormForm | None]:
    """The norm whose output `module`'s first call reads as its first input (not `container`, the module it
    runs inside), and its form; (None, None) when no norm's output is that input."""
    first = next((c for c in calls if c.module is module), None)
    if first is None or not first.inputs:
        raise ConfigError(f"{name} was not called as a module in a forward")
    x = first.inputs[0]
    for call in calls:
        if call.module is module or call.module is container or not call.inputs:
            continue
        if not any(o is x for o in call.outputs):
            continue
        form = declared(adapter, call.module) or infer(call.module, call.inputs[0], x)
        if form is not None:
            return call.module, form
    return None, None
