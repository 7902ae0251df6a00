"""The fallback for hand-written attention: a site is any module inside which a softmax over
[B, H, Tq, Tk] or an F.scaled_dot_product_attention call happens during a traced forward of a
real example (_trace.py, which also finds the output projection, inside the module or applied
by its parent after it returns). Probabilities come from the intercept (see _intercept.py), the
gate is a pre-hook on that projection.

InterceptAdapter is the public base for an adapter of one's own (diagnose.adapters): subclass
it, write `find(model)` returning AttentionSites with their `out_proj`, and register it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, NoAttentionFoundError
from ._hooks import blocks_around, gate_projection
from ._intercept import AttentionMode, watch_probs, watch_probs_traced
from .base import AttentionSite, HeadOutputFn, PatternCallback
from ._trace import Trace, first_example, sample_input, trace  # noqa: F401  (the last two: for their old importers)
from .layout import BLOCKED, Projection, ProjectionLayout

_HEAD_DIM_ATTRS = ("head_dim", "head_size", "d_head", "dim_head", "attention_head_size", "hs")
_HEADS_ATTRS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "nh", "heads")
# what prune's cut sets to the heads kept, and the q/k/v Linear names it recognises
_COUNT_NAMES = ("n_head", "n_heads", "num_heads", "num_attention_heads")
_QKV_NAMES = (("q", "query", "q_proj", "q_lin"), ("k", "key", "k_proj", "k_lin"), ("v", "value", "v_proj", "v_lin"))


class InterceptAdapter(ABC):
    """The base of an adapter for attention diagnose does not find by itself: write `find(model)`,
    returning one AttentionSite per attention module (in forward order) whose `module` computes the
    softmax or calls F.scaled_dot_product_attention and whose `out_proj` is the module whose input is
    the heads side by side [B, T, H * D]; this class gives the rest: the probabilities from the
    intercept (eager and compiled), the head gate as a pre-hook on out_proj, and the residual blocks.
    Register an instance with diagnose.register_adapter. Override `blocks(model)` where the blocks
    are not the ModuleList/Sequential items around the sites. docs/families.md has an example."""

    family = "intercept"

    @abstractmethod
    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        """Sites in forward order, or None when the model is not of this family."""

    def watch_pattern(self, site: AttentionSite, callback: PatternCallback):
        return watch_probs(site.module, callback)

    def compile_safe(self, site: AttentionSite) -> bool:
        """Under torch.compile the intercept runs as `with mode:` around the forward, which dynamo
        traces into the graph (watch_pattern_traced; base.TRACED_HOOKS says from which torch)."""
        return True

    def watch_pattern_traced(self, site: AttentionSite, callback: PatternCallback):
        return watch_probs_traced(site.module, callback)

    def intervene(self, site: AttentionSite, fn: HeadOutputFn):
        if site.out_proj is None:
            raise ConfigError(f"attention module {site.name!r} has no output projection diagnose can gate; "
                              "register an adapter for it (diagnose.register_adapter)")
        return gate_projection(site.out_proj, site.n_heads, site.head_dim, fn)

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return blocks_around(model, self.find(model) or [])


class GenericAdapter(InterceptAdapter):
    """Any module that calls softmax over [B, H, Tq, Tk] or F.scaled_dot_product_attention."""

    family = "generic"

    def __init__(self, example: Any = None):
        self.example = example
        # (id(model), sites, the trace's finishing order): blocks() needs no new trace
        self._found: tuple[int, list[AttentionSite], dict[str, int]] | None = None
        self.applied_more_than_once = False  # a site module ran twice in the traced forward (shared.py splits it)
        self.failure: str | None = None  # why the traced forward did not run, for find_heads' error

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        t = trace(model, self.example)
        self.failure = t.failure
        if not t.sites:
            return None
        sites = [AttentionSite(i, r["name"], r["n_heads"], r["head_dim"], r["module"], self, out_proj=r["out_proj"])
                 for i, r in enumerate(t.sites)]
        self.applied_more_than_once = any(r["calls"] > 1 for r in t.sites)
        self._found = (id(model), sites, t.finished)
        return sites

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        if self._found is not None and self._found[0] == id(model):
            return blocks_around(model, self._found[1], self._found[2])
        return super().blocks(model)

    def layout(self, site: AttentionSite) -> ProjectionLayout:
        """What nanoGPT-style attention has: a fused [q; k; v] Linear (out = 3 * H * D) or three Linears
        named like q/k/v, a Linear output projection, and an attribute holding the head count.

        The module's forward must split by n_head * head_dim, not by the embedding width (nanoGPT's
        `split(self.n_embd)` would not run once heads are gone), and a layer left with no heads must
        not split an empty tensor (torch's split(0) returns one piece): prune's verification step
        catches either and says so."""
        attn, width = site.module, site.n_heads * site.head_dim
        counts = tuple(n for n in _COUNT_NAMES if getattr(attn, n, None) == site.n_heads)
        if not counts or not isinstance(site.out_proj, nn.Linear):
            raise ConfigError(f"{type(attn).__name__}: cannot be cut: it needs a head-count attribute "
                              f"({', '.join(_COUNT_NAMES)}) and a Linear output projection")
        linears = {n: m for n, m in attn.named_children() if isinstance(m, nn.Linear) and m is not site.out_proj}
        fused = [n for n, m in linears.items() if m.out_features == 3 * width]
        separate = [next((n for n in names if n in linears and linears[n].out_features == width), None)
                    for names in _QKV_NAMES]
        if len(fused) == 1:
            inputs = (Projection(fused[0], BLOCKED),)
        elif all(n is not None for n in separate):
            inputs = tuple(Projection(n) for n in separate)
        else:
            raise ConfigError(f"{type(attn).__name__}: cannot be cut: no fused query/key/value Linear of "
                              f"{3 * width} outputs and no q/k/v Linears of {width} outputs")
        return ProjectionLayout(inputs=inputs, heads=counts)


def glob_match(pattern: str, name: str) -> bool:
    """`*` matches within one dotted component, `**` across components: 'encoder.layers.*.attn'."""
    parts = (re.escape(p).replace(r"\*", "[^.]*") for p in pattern.split("**"))
    return re.fullmatch(".*".join(parts), name) is not None


def matching_modules(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """The modules `pattern` names, outermost only (a match inside another is part of it): `re:REGEX`
    over qualified names (re.fullmatch); a class name (`Attention`, or `pkg.module.Attention`) when a
    module's class is called that; else a glob over qualified names (glob_match)."""
    if pattern.startswith("re:"):
        try:
            rx = re.compile(pattern[3:])
        except re.error as exc:
            raise ConfigError(f"--attention-module {pattern!r}: not a regular expression ({exc})") from None
        hit = [(n, m) for n, m in model.named_modules() if rx.fullmatch(n)]
    else:
        by_class = [(n, m) for n, m in model.named_modules()
                    if pattern in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")]
        hit = by_class or [(n, m) for n, m in model.named_modules() if glob_match(pattern, n)]
    return [(n, m) for n, m in hit if not any(n != o and (o == "" or n.startswith(o + ".")) for o, _ in hit)]


def _traced_inside(traced: Trace, name: str) -> list[dict]:
    return [r for r in traced.sites if r["name"] == name or name == "" or r["name"].startswith(name + ".")]


def _refuse_silent(pattern: str, silent: list[tuple[str, nn.Module]], traced: Trace) -> None:
    listed = ", ".join(f"{n} ({type(m).__name__})" for n, m in silent[:4]) + (", ..." if len(silent) > 4 else "")
    why = (f"; {traced.failure}" if traced.failure else
           " in a traced forward, so they are not attention (a feed-forward, a norm)")
    raise NoAttentionFoundError(f"--attention-module {pattern!r} matches modules that compute no softmax or "
                                f"scaled_dot_product_attention: {listed}{why}; name only the attention modules, by "
                                "their class (--attention-module Attention) or a regex over qualified names "
                                "(--attention-module 're:.*\\.attn')")


def named_sites(model: nn.Module, pattern: str, n_heads: int | None, example: Any = None) -> list[AttentionSite]:
    """Sites the user named (matching_modules); a named module inside which no softmax/SDPA ran in a
    traced forward is refused, not swept as heads."""
    from ._torch_mha import MHAAdapter

    matched = matching_modules(model, pattern)
    if not matched:
        raise NoAttentionFoundError(f"no module name or class matches --attention-module {pattern!r}; names look like "
                                    "'encoder.layers.0.self_attn' (see model.named_modules()), classes like 'Attention'")
    traced = trace(model, example)
    silent = [(n, m) for n, m in matched if not isinstance(m, nn.MultiheadAttention) and not _traced_inside(traced, n)]
    if silent:
        _refuse_silent(pattern, silent, traced)
    generic, mha = GenericAdapter(example), MHAAdapter()
    sites = []
    for i, (name, mod) in enumerate(matched):
        if isinstance(mod, nn.MultiheadAttention):
            sites.append(mha.site(i, name, mod))
            continue
        inner = _traced_inside(traced, name)
        rec = next((r for r in inner if n_heads is None or r["n_heads"] == n_heads), {})
        H = n_heads or rec.get("n_heads") or _attr(mod, _HEADS_ATTRS)
        D = rec.get("head_dim") or _attr(mod, _HEAD_DIM_ATTRS)
        if D is None:
            dims = [lin.in_features // H for lin in mod.modules() if isinstance(lin, nn.Linear) and lin.in_features % H == 0]
            D = dims[-1] if dims else None
        if D is None:
            raise NoAttentionFoundError(f"cannot tell the head dim of {name!r}; register an adapter for it "
                                        "(diagnose.adapters.InterceptAdapter, docs/families.md)")
        proj = rec.get("out_proj")
        if proj is None:
            cands = [lin for lin in mod.modules() if isinstance(lin, nn.Linear) and lin.in_features == H * D]
            proj = cands[-1] if cands else None
        sites.append(AttentionSite(i, name, H, D, mod, generic, out_proj=proj))
    generic._found = (id(model), [s for s in sites if s.adapter is generic], traced.finished)
    return sites
