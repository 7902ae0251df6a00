"""A head's direct path found by tracing one forward, for models whose adapter declares none.

Code nobody here wrote (nanoGPT, minGPT, timm, torchvision, x-transformers, a post-norm stack) has no
declared path (readout.py), but every forward shows it. One traced forward (the first example of the
data, eval mode, no_grad, RNG restored) records each module call: its input and output tensors (by
identity) and when it began and ended. From that:

- the layer stack: the outermost ModuleList / Sequential holding every attention site; its items that
  hold a site or a norm are the layers (an embedding or a head in the same Sequential is not one);
- the norms: every module of the layers that its adapter or `register_norm` declares a norm, or that
  behaves like one (norms.infer), and the final norms called after the stack before any other module
  with parameters (a ViT's `norm` or `fc_norm`, nanoGPT's `ln_f`);
- each site's write: its output projection's output (the site's own output where the projection is
  not called as a module, torch's MultiheadAttention), then every module fed by it (LayerScale, a
  dropout, a post-attention norm) up to the one that adds it to the stream (x-transformers' Residual);
- the sublayers: the largest called modules of the layers that hold parameters, no norm and nothing
  of a site's write, and do not hold the site (attention of other layers, MLPs, minGPT's c_fc and c_proj).

The direct pass of a head (ablation/direct_clamp.py) closes it through its gate, makes every other
sublayer return its clean output and every norm its clean output plus its frozen change; the write's
modules and everything after the stack run as they are. ConfigError (one line) where this cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..objectives import call_model
from ._generic import first_example
from ._hooks import hooks
from .base import AttentionSite
from .norms import NormForm, declared, infer, looks_like_norm

_WHY = "so direct effects are not measured"
# the fix for a path the trace cannot find: declare it (readout.py), as the built-in families do
_FIX = ("so direct effects are not measured; an adapter for the model can declare the path (residual_path, "
        "diagnose/adapters/readout.py)")


@dataclass
class Call:
    """One module call of the traced forward."""

    name: str
    module: nn.Module
    begin: int
    inputs: list[torch.Tensor]  # its tensor arguments, positional then keyword
    end: int = -1
    outputs: list[torch.Tensor] = field(default_factory=list)  # the tensors it returned (a tuple's items)


@dataclass(frozen=True)
class StreamPlan:
    """What the clamped direct passes need: per site the sublayers to clamp, and the norms to freeze."""

    stack: str
    sublayers: tuple[nn.Module, ...]  # every module clamped for some site (clean outputs recorded)
    clamp: tuple[tuple[int, ...], ...]  # per site: indices into sublayers clamped while it is ablated
    norms: tuple[nn.Module, ...]
    forms: tuple[NormForm, ...]  # per norm

    def describe(self) -> str:
        return (f"traced: the layers of {self.stack or 'the model'}, {len(self.sublayers)} sublayers held at their "
                f"clean output, {len(self.norms)} norms frozen")


def trace_calls(model: nn.Module, example: Any) -> list[Call]:
    """Every module call of one forward on `example`, in the order they began (tensors kept alive, so
    that identity tells which call fed which). Training flags and the RNG are restored after."""
    names = {m: n for n, m in model.named_modules()}
    calls: list[Call] = []
    running: list[Call] = []
    clock = [0]

    def tensors(obj: Any) -> list[torch.Tensor]:
        if isinstance(obj, torch.Tensor):
            return [obj]
        if isinstance(obj, (tuple, list)):
            return [t for t in obj if isinstance(t, torch.Tensor)]
        if isinstance(obj, dict):
            return [t for t in obj.values() if isinstance(t, torch.Tensor)]
        return []

    def pre(m, args, kwargs):
        clock[0] += 1
        call = Call(names[m], m, clock[0], tensors(tuple(args)) + tensors(kwargs))
        calls.append(call)
        running.append(call)

    def post(m, _args, _kwargs, out):
        clock[0] += 1
        call = running.pop()
        call.end, call.outputs = clock[0], tensors(out)

    regs = [lambda m=m: m.register_forward_pre_hook(pre, with_kwargs=True) for m in names] + \
           [lambda m=m: m.register_forward_hook(post, with_kwargs=True, always_call=True) for m in names]
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), hooks(*regs):
            call_model(model, example)
    finally:
        for m, t in flags.items():
            m.training = t
    return calls


def stream_plan(model: nn.Module, sites: Sequence[AttentionSite], example: Any) -> StreamPlan:
    """The plan for `sites` of `model`, from one traced forward on `example` (module docstring). The model
    runs in eval mode, without grad and with the RNG restored, also where a module is tried as a norm."""
    if example is None:
        raise ConfigError(f"no example input to trace the model with, {_WHY}")
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            return _plan(model, sites, example)
    finally:
        for m, t in flags.items():
            m.training = t


def _plan(model: nn.Module, sites: Sequence[AttentionSite], example: Any) -> StreamPlan:
    """stream_plan's work, the model already in eval mode."""
    try:
        calls = trace_calls(model, first_example(example))
    except Exception as e:  # noqa: BLE001 - the reason goes into the one line the user reads
        raise ConfigError(f"tracing one forward to find each head's path failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}), {_FIX}") from None
    modules = dict(model.named_modules())
    adapter = sites[0].adapter
    stack, items = _stack(modules, sites)
    under = [c for c in calls if any(_under(c.name, i) for i in items)]
    found = _norms(adapter, under, "a norm in the layers")
    layers = [i for i in items if any(_under(s.name.split("#")[0], i) for s in sites)
              or any(_under(c.name, i) for c, _ in found)]
    inside = [c for c in under if any(_under(c.name, l) for l in layers)]
    if not inside:
        raise ConfigError(f"the layers of {stack or 'the model'} never ran in the traced forward, {_FIX}")
    last = max(c.end for c in inside)
    norms = [(c, f) for c, f in found if any(_under(c.name, l) for l in layers)] + \
        _final_norms(adapter, [c for c in calls if c.begin > last])
    norm_names = {c.name for c, _ in norms}
    once = _called_once(calls, norms)
    sublayers: dict[str, nn.Module] = {}
    clamp = []
    for site in sites:
        live = _write(calls, modules, site, norm_names)
        chosen = _sublayers(inside, once, norm_names, live, site)
        for name in chosen:
            sublayers.setdefault(name, modules[name])
        clamp.append(chosen)
    order = list(sublayers)
    return StreamPlan(stack, tuple(sublayers.values()), tuple(tuple(order.index(n) for n in c) for c in clamp),
                      tuple(c.module for c, _ in norms), tuple(f for _, f in norms))


def _under(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _stack(modules: dict[str, nn.Module], sites: Sequence[AttentionSite]) -> tuple[str, list[str]]:
    """(the stack's name, its items' names): the outermost ModuleList / Sequential holding every site."""
    covering = [n for n, m in modules.items() if isinstance(m, (nn.ModuleList, nn.Sequential))
                and all(_under(s.name.split("#")[0], n) and s.name != n for s in sites)]
    if not covering:
        raise ConfigError("the attention sites do not sit in one stack of layers (a ModuleList or Sequential "
                          f"holding them all: an encoder and a decoder, or a lone attention module), {_FIX}")
    stack = min(covering, key=lambda n: (n.count(".") if n else -1, len(n)))
    prefix = f"{stack}." if stack else ""
    return stack, [f"{prefix}{child}" for child, _ in modules[stack].named_children()]


def _norms(adapter: Any, calls: Sequence[Call], where: str) -> list[tuple[Call, NormForm]]:
    """(call, form) of each norm among `calls`; ConfigError for one that behaves like a norm but no form fits."""
    out = []
    for c in calls:
        form = declared(adapter, c.module)
        if form is None and len(c.inputs) == 1 and len(c.outputs) == 1 and looks_like_norm(c.module, c.inputs[0],
                                                                                            c.outputs[0]):
            form = infer(c.module, c.inputs[0], c.outputs[0])
            if form is None:
                raise ConfigError(f"{where}, {c.name} ({type(c.module).__name__}), normalises its input in a way "
                                  "diagnose cannot freeze (not a LayerNorm or RMSNorm of its weight); declare its "
                                  f"frozen form with diagnose.register_norm({type(c.module).__name__}, ...), {_WHY}")
        if form is not None:
            out.append((c, form))
    return out


def _final_norms(adapter: Any, after: Sequence[Call]) -> list[tuple[Call, NormForm]]:
    """The norms called after the stack, up to the first module with parameters of its own that holds no
    norm (the output layers: an unembedding, a pooler, a classifier); a norm's wrapper (x-transformers'
    LayerNorm times its gamma) holds one, so the norm inside it is a final norm."""
    found = _norms(adapter, after, "the final norm")
    names = [c.name for c, _ in found]
    out = []
    for c in after:
        if c.name in names:
            out.append(found[names.index(c.name)])
        elif any(True for _ in c.module.parameters(recurse=False)) and not any(_under(n, c.name) for n in names):
            break
    return out


def _called_once(calls: Sequence[Call], norms: Sequence[tuple[Call, NormForm]]) -> dict[str, int]:
    """How many times each module ran; ConfigError for a norm on the path that ran more than once."""
    count: dict[str, int] = {}
    for c in calls:
        count[c.name] = count.get(c.name, 0) + 1
    for c, _ in norms:
        if count[c.name] != 1:
            raise ConfigError(f"the norm {c.name} ran {count[c.name]} times in one forward, so its clean scale is "
                              f"ambiguous, {_FIX}")
    return count


def _write(calls: Sequence[Call], modules: dict[str, nn.Module], site: AttentionSite, norms: set[str]) -> set[str]:
    """The names of the modules that carry the site's write to the stream (module docstring), the site
    module and its ancestors: none of them is clamped while the site is ablated. A norm fed by the write
    (Gemma 2's post-attention norm) is part of it and ends it, as a module that adds it to the stream does:
    past either, the write is the stream, which the next sublayer reads."""
    base = site.name.split("#")[0]
    names = {m: n for n, m in modules.items()}
    proj = names.get(site.out_proj) if site.out_proj is not None else None
    started = [c for c in calls if c.name == proj] if proj is not None else []
    start = started[0] if len(started) == 1 else next((c for c in calls if c.name == base), None)
    if start is None:
        raise ConfigError(f"{site.name} never ran in the traced forward, {_FIX}")
    owner = base if _under(start.name, base) else _common(base, start.name)
    seeds = [c for c in calls if c.begin <= start.begin and c.end >= start.end and _under(c.name, owner)]
    carrying = {id(t) for c in seeds for t in c.outputs}
    live = {c.name for c in seeds} | {base}
    for c in calls:
        if c.begin <= start.end:
            continue
        fed = [t for t in c.inputs if id(t) in carrying]
        if not fed:
            continue
        live.add(c.name)
        others = [t for t in c.inputs if id(t) not in carrying and t.shape == fed[0].shape]
        if not others and c.name not in norms:  # a module that adds the write to the stream ends the write
            carrying |= {id(t) for t in c.outputs}
    parts = base.split(".")
    return live | {".".join(parts[:i]) for i in range(len(parts))}


def _common(a: str, b: str) -> str:
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    return ".".join(pa[:n])


def _sublayers(inside: Sequence[Call], count: dict[str, int], norms: set[str], live: set[str],
               site: AttentionSite) -> tuple[str, ...]:
    """The largest called modules of the layers to clamp while `site` is ablated (module docstring)."""
    base = site.name.split("#")[0]
    chosen: list[str] = []
    for c in inside:
        if c.name in chosen or any(_under(c.name, p) for p in chosen):
            continue
        if (_under(c.name, base) or any(_under(n, c.name) for n in live | norms)
                or not any(True for _ in c.module.parameters())):
            continue
        if count[c.name] != 1:
            raise ConfigError(f"{c.name} ran {count[c.name]} times in one forward, so its clean output is "
                              f"ambiguous, {_FIX}")
        chosen.append(c.name)
    return tuple(chosen)
