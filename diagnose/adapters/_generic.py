"""The fallback for hand-written attention: a site is any module inside which a softmax over
[B, H, Tq, Tk] or an F.scaled_dot_product_attention call happens during a small tracing
forward; its output projection is the last nn.Linear called inside it whose in_features is
H * D. Probabilities come from the intercept (see _intercept.py), the gate is a pre-hook on
that projection.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, NoAttentionFoundError
from ..objectives import call_model
from ._hooks import blocks_around, gate_projection, hooks
from ._intercept import AttentionMode, watch_probs, watch_probs_traced
from .base import AttentionSite, HeadOutputFn, PatternCallback
from .layout import BLOCKED, Projection, ProjectionLayout

_HEAD_DIM_ATTRS = ("head_dim", "head_size", "d_head", "attention_head_size", "hs")
_HEADS_ATTRS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "nh", "heads")
# what prune's cut sets to the heads kept, and the q/k/v Linear names it recognises
_COUNT_NAMES = ("n_head", "n_heads", "num_heads", "num_attention_heads")
_QKV_NAMES = (("q", "query", "q_proj", "q_lin"), ("k", "key", "k_proj", "k_lin"), ("v", "value", "v_proj", "v_lin"))


class InterceptAdapter(ABC):
    """Shared mechanics for families whose probabilities come from the softmax/SDPA intercept
    and whose heads meet at an output projection (site.out_proj)."""

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


def sample_input(model: nn.Module) -> torch.Tensor | None:
    """A tiny input a model is likely to take: token ids for its first Embedding, or
    features for its first Linear.  # [2, 8] or [2, 8, C]"""
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return torch.randint(0, m.num_embeddings, (2, 8), device=m.weight.device)
        if isinstance(m, nn.Linear):
            return torch.randn(2, 8, m.in_features, device=m.weight.device, dtype=m.weight.dtype)
    return None


def first_example(inputs: Any) -> Any:
    """The first example of a batch (tracing needs no more).  # Tensor [1, ...] or Mapping of them"""
    if isinstance(inputs, torch.Tensor):
        return inputs[:1]
    if isinstance(inputs, Mapping):
        return {k: (v[:1] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in inputs.items()}
    return inputs


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    for n in names:
        v = getattr(module, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def trace_attention(model: nn.Module, example: Any = None) -> list[dict]:
    """Run one forward and record, per module that computes attention (innermost running
    module at the softmax/SDPA call), in first-call order: name, module, n_heads, head_dim,
    and the output projection. Training flags and the RNG are restored after."""
    example = sample_input(model) if example is None else first_example(example)
    if example is None:
        return []
    names = {m: n for n, m in model.named_modules()}
    stack: list[str] = []
    calls: dict[str, int] = {}
    found: dict[str, dict] = {}
    linears: list[tuple[tuple[str, ...], nn.Linear]] = []  # (running modules, linear) in call order

    def pre(m, _args):
        stack.append(names[m])
        calls[names[m]] = calls.get(names[m], 0) + 1

    def post(m, _args, _out):
        stack.pop()
        if isinstance(m, nn.Linear):
            linears.append((tuple(stack), m))

    def on_call(kind: str, probs: torch.Tensor, q: torch.Tensor | None) -> None:
        if not stack:
            return
        rec = found.setdefault(stack[-1], {"name": stack[-1], "n_heads": probs.shape[1], "after": len(linears)})
        if q is not None:
            rec["head_dim"] = q.shape[-1]

    flags = {m: m.training for m in model.modules()}
    regs = [lambda m=m: m.register_forward_pre_hook(pre) for m in names] + \
           [lambda m=m: m.register_forward_hook(post, always_call=True) for m in names]
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), hooks(*regs), AttentionMode(on_call):
            call_model(model, example)
    except Exception:  # a model that does not take the sample input: nothing found
        return []
    finally:
        for m, t in flags.items():
            m.training = t
    modules = dict(model.named_modules())
    out = []
    for rec in found.values():
        mod, H = modules[rec["name"]], rec["n_heads"]
        inside = [lin for running, lin in linears[rec["after"]:] if rec["name"] in running or rec["name"] == ""]
        D = rec.get("head_dim") or _attr(mod, _HEAD_DIM_ATTRS)
        if D is None:
            dims = [lin.in_features // H for lin in inside if lin.in_features % H == 0]
            D = dims[-1] if dims else None
        if D is None:
            continue
        proj = [lin for lin in inside if lin.in_features == H * D]
        out.append(dict(name=rec["name"], module=mod, n_heads=H, head_dim=D, out_proj=proj[-1] if proj else None,
                        calls=calls.get(rec["name"], 1)))
    return out


class GenericAdapter(InterceptAdapter):
    """Any module that calls softmax over [B, H, Tq, Tk] or F.scaled_dot_product_attention."""

    family = "generic"

    def __init__(self, example: Any = None):
        self.example = example
        self._found: tuple[int, list[AttentionSite]] | None = None  # (id(model), sites): blocks() needs no new trace
        self.applied_more_than_once = False  # a site module ran twice in the traced forward (shared.py splits it)

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        recs = trace_attention(model, self.example)
        if not recs:
            return None
        sites = [AttentionSite(i, r["name"], r["n_heads"], r["head_dim"], r["module"], self, out_proj=r["out_proj"])
                 for i, r in enumerate(recs)]
        self.applied_more_than_once = any(r["calls"] > 1 for r in recs)
        self._found = (id(model), sites)
        return sites

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        if self._found is not None and self._found[0] == id(model):
            return blocks_around(model, self._found[1])
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


def named_sites(model: nn.Module, pattern: str, n_heads: int | None, example: Any = None) -> list[AttentionSite]:
    """Sites the user named: modules whose qualified name matches the glob `pattern`."""
    from ._torch_mha import MHAAdapter

    matched = [(n, m) for n, m in model.named_modules() if glob_match(pattern, n)]
    if not matched:
        raise NoAttentionFoundError(f"no module name matches --attention-module {pattern!r}; "
                                    "names look like 'encoder.layers.0.self_attn' (see model.named_modules())")
    traced = {r["name"]: r for r in trace_attention(model, example)}
    generic, mha = GenericAdapter(example), MHAAdapter()
    sites = []
    for i, (name, mod) in enumerate(matched):
        if isinstance(mod, nn.MultiheadAttention):
            sites.append(mha.site(i, name, mod))
            continue
        H = n_heads or traced.get(name, {}).get("n_heads") or _attr(mod, _HEADS_ATTRS)
        if H is None:
            raise NoAttentionFoundError(f"cannot tell how many heads {name!r} has; pass --heads N (n_heads=N)")
        rec = traced.get(name, {})
        D = rec.get("head_dim") if rec.get("n_heads") == H else None
        D = D or _attr(mod, _HEAD_DIM_ATTRS)
        lins = [m for m in mod.modules() if isinstance(m, nn.Linear)]
        proj = rec.get("out_proj") if rec.get("n_heads") == H else None
        if D is None:
            dims = [lin.in_features // H for lin in lins if lin.in_features % H == 0]
            D = dims[-1] if dims else None
        if D is None:
            raise NoAttentionFoundError(f"cannot tell the head dim of {name!r}; register an adapter for it "
                                        "(diagnose.register_adapter)")
        if proj is None:
            cands = [lin for lin in lins if lin.in_features == H * D]
            proj = cands[-1] if cands else None
        sites.append(AttentionSite(i, name, H, D, mod, generic, out_proj=proj))
    generic._found = (id(model), [s for s in sites if s.adapter is generic])
    return sites
