"""Attention modules applied more than once per forward (ALBERT shares one layer across all
depths): one site per application, each with its own map, statistics and gate.

`split_shared`, when there is evidence of sharing (see _may_share), runs one forward (first
example, eval mode, no_grad, RNG restored) counting the calls of each site's module; a module
called n > 1 times becomes n sites named `NAME#k`, in call order, whose adapter (`_Application`)
wraps the family's own: its pattern callback and its head gate act on the k-th call of every
forward only (call count modulo n), the other calls pass through untouched. Residual blocks are the family's own; the prefix replay of the ablation never
replays a block called more than once, so it stays correct.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn

from ._hooks import hooks
from ._trace import call_example
from .base import AttentionSite, HeadOutputFn, PatternCallback


class _Application:
    """The k-th of n applications of a shared module, through the family adapter `inner`."""

    def __init__(self, inner: Any, base: AttentionSite, k: int, n: int):
        self.inner, self.base, self.k, self.n = inner, base, k, n
        self.family = inner.family

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        return None  # never found by itself: made by split_shared

    def _only_kth(self, fn, passthrough):
        calls = [0]

        def wrapped(x):
            i = calls[0]
            calls[0] += 1
            return fn(x) if i % self.n == self.k else passthrough(x)
        return wrapped

    def watch_pattern(self, site: AttentionSite, callback: PatternCallback):
        return self.inner.watch_pattern(self.base, self._only_kth(callback, lambda _p: None))

    def intervene(self, site: AttentionSite, fn: HeadOutputFn):
        return self.inner.intervene(self.base, self._only_kth(fn, lambda x: x))

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return self.inner.blocks(model)


def _call_order(model: nn.Module, sites: list[AttentionSite], example: Any) -> list[int] | None:
    """Indices into `sites` in the order their modules were called in one forward; None if it failed."""
    order: list[int] = []

    def pre(i: int):
        def hook(_m, _args):
            order.append(i)
        return hook

    first: dict[int, int] = {}
    for i, s in enumerate(sites):
        first.setdefault(id(s.module), i)  # two sites on one module (should not happen): count once
    regs = [lambda m=s.module, i=i: m.register_forward_pre_hook(pre(i))
            for i, s in enumerate(sites) if first[id(s.module)] == i]
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), hooks(*regs):
            call_example(model, example)
    except Exception as exc:  # noqa: BLE001 - said once below; the sites stay as they are
        warnings.warn(f"whether an attention module runs more than once per forward was not checked (the "
                      f"counting forward raised {type(exc).__name__}: {exc}); pass the model's real inputs as "
                      "example=", RuntimeWarning, stacklevel=4)
        return None
    finally:
        for m, t in flags.items():
            m.training = t
    return order


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def _may_share(model: nn.Module, sites: list[AttentionSite]) -> bool:
    """Cheap evidence of sharing, so that the counting forward runs only when it may find some:
    the generic adapter's traced forward saw a site module run twice, or the config counts more
    layers than there are attention modules (ALBERT: num_hidden_layers 12, one layer)."""
    if any(getattr(s.adapter, "applied_more_than_once", False) for s in sites):
        return True
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    declared = next((getattr(cfg, n) for n in _LAYER_COUNTS if isinstance(getattr(cfg, n, None), int)), None)
    return declared is not None and declared > len({id(s.module) for s in sites})


def split_shared(model: nn.Module, sites: list[AttentionSite], example: Any = None) -> list[AttentionSite]:
    """The sites with every module applied n > 1 times per forward split into n sites, in call order."""
    from ._trace import first_example, sample_input

    if not sites or not _may_share(model, sites):
        return sites
    example = sample_input(model) if example is None else first_example(example)
    if example is None:
        return sites
    order = _call_order(model, sites, example)
    if not order or len(order) == len(set(order)):
        return sites  # nothing applied twice (or nothing observed): the usual case, unchanged
    counts = {i: order.count(i) for i in set(order)}
    out: list[AttentionSite] = []
    seen: dict[int, int] = {}
    for i in order:
        s = sites[i]
        k = seen.get(i, 0)
        seen[i] = k + 1
        n = counts[i]
        if n == 1:
            out.append(replace(s, layer=len(out)))
            continue
        out.append(replace(s, layer=len(out), name=f"{s.name}#{k}", adapter=_Application(s.adapter, s, k, n),
                           application=(k, n)))
    out += [replace(s, layer=len(out) + j) for j, s in enumerate(x for i, x in enumerate(sites) if i not in counts)]
    return out


def shared_modules(sites: list[AttentionSite]) -> list[dict[str, Any]]:
    """Per shared module: its name, how many times one forward applies it, and its sites' layers."""
    groups: dict[str, dict[str, Any]] = {}
    for s in sites:
        if s.application is not None:
            g = groups.setdefault(s.name.rsplit("#", 1)[0], {"applications": s.application[1], "layers": []})
            g["layers"].append(s.layer)
    return [{"module": name, **g} for name, g in groups.items()]
