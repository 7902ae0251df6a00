"""One traced forward of a model on a real example: which modules compute attention (the innermost
module running at each softmax over [B, H, Tq, Tk] or F.scaled_dot_product_attention call), each
one's head count and head dim, its output projection, and the order modules finish in (which the
residual blocks are read from, _hooks.blocks_around).

The output projection is the last nn.Linear run inside the attention module whose in_features is
H * D (nanoGPT's c_proj, timm's proj), or, when none runs inside, the first such Linear its parent
runs after the attention module returns (x-transformers: `Attend` returns the heads [B, H, T, D]
and the parent `Attention` merges them and applies `to_out`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..objectives import call_model
from ._hooks import first_tensor, hooks
from ._intercept import AttentionMode

_HEAD_DIM_ATTRS = ("head_dim", "head_size", "d_head", "dim_head", "attention_head_size", "hs")


@dataclass
class Trace:
    """What one traced forward saw. `sites`: per attention module, in first-call order, a dict of
    name, module, n_heads, head_dim, out_proj, calls. `finished`: module name -> the index of its
    last forward's end, in finishing order. `failure`: why nothing could be traced (None when it ran)."""

    sites: list[dict] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)
    failure: str | None = None


def sample_input(model: nn.Module) -> torch.Tensor | None:
    """Token ids for a model whose first parameterised module is an Embedding, the one input whose
    shape is not a guess (any [B, T] of ids in range).  # [2, 8]; None for anything else"""
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return torch.randint(0, m.num_embeddings, (2, 8), device=m.weight.device)
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            return None
    return None


def first_example(inputs: Any) -> Any:
    """The first example of a batch (tracing needs no more).  # Tensor [1, ...] or Mapping of them"""
    if isinstance(inputs, torch.Tensor):
        return inputs[:1]
    if isinstance(inputs, Mapping):
        return {k: (v[:1] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in inputs.items()}
    if isinstance(inputs, Called):
        return Called(tuple(first_example(a) for a in inputs.args), first_example(inputs.kwargs))
    return inputs


@dataclass(frozen=True)
class Called:
    """The positional and keyword arguments of a forward call as the user's code made it (the monitor
    captures the first training forward's), called the same way again."""

    args: tuple
    kwargs: dict

    def __call__(self, model: nn.Module) -> Any:
        return model(*self.args, **self.kwargs)


def call_example(model: nn.Module, example: Any) -> Any:
    """Run `model` on an example: a Called as it was called, else as call_model passes inputs."""
    return example(model) if isinstance(example, Called) else call_model(model, example)


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    for n in names:
        v = getattr(module, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _describe(example: Any) -> str:
    if isinstance(example, torch.Tensor):
        return f"a {str(example.dtype).replace('torch.', '')} tensor {list(example.shape)}"
    if isinstance(example, Mapping):
        return "{" + ", ".join(example) + "}"
    return type(example).__name__


def trace(model: nn.Module, example: Any = None) -> Trace:
    """One no-grad forward of `example` (first_example of it; token ids when None and the model starts
    with an Embedding) with every module hooked. Training flags and the RNG are restored after; a
    forward that raises is kept in `failure` with what was passed, for the caller to report."""
    guessed = example is None
    example = sample_input(model) if guessed else first_example(example)
    if example is None:
        return Trace(failure=f"{type(model).__name__} does not start with an nn.Embedding, so its input cannot be "
                             "told: pass a real example (example=inputs; TrainingMonitor(example=...) or its "
                             "first training step)")
    names = {m: n for n, m in model.named_modules()}
    stack: list[str] = []
    calls: dict[str, int] = {}
    found: dict[str, dict] = {}
    finished: dict[str, int] = {}
    order = [0]  # modules finished so far
    linears: list[tuple[tuple[str, ...], nn.Linear]] = []  # (running modules, linear) in call order

    def pre(m, _args):
        stack.append(names[m])
        calls[names[m]] = calls.get(names[m], 0) + 1

    def post(m, _args, out):
        name = stack.pop()
        finished[name] = order[0]
        order[0] += 1
        if isinstance(m, nn.Linear):
            linears.append((tuple(stack), m))
        rec = found.get(name)
        if rec is not None and "returned" not in rec:
            rec["returned"] = len(linears)
            y = first_tensor(out)
            if isinstance(y, torch.Tensor) and y.dim() == 4 and y.shape[1] == rec["n_heads"]:
                rec["out_dim"] = int(y.shape[-1])  # [B, H, T, D]: the heads, returned unmerged

    def on_call(kind: str, probs: torch.Tensor, q: torch.Tensor | None) -> None:
        if not stack:
            return
        rec = found.setdefault(stack[-1], {"name": stack[-1], "n_heads": probs.shape[1], "after": len(linears)})
        if q is not None:
            rec.setdefault("head_dim", q.shape[-1])

    flags = {m: m.training for m in model.modules()}
    regs = [lambda m=m: m.register_forward_pre_hook(pre) for m in names] + \
           [lambda m=m: m.register_forward_hook(post, always_call=True) for m in names]
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), hooks(*regs), AttentionMode(on_call):
            call_example(model, example)
    except Exception as exc:  # noqa: BLE001 - reported by the caller, which names the part it loses
        what = ("guessed token ids [2, 8]" if guessed else _describe(example))
        return Trace(failure=f"the traced forward of {type(model).__name__} on {what} raised "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                             f"(pass the model's real inputs as example=)")
    finally:
        for m, t in flags.items():
            m.training = t
    modules = dict(model.named_modules())
    return Trace(sites=[r for r in (_site(rec, modules, linears, calls) for rec in found.values()) if r],
                 finished=finished)


def _site(rec: dict, modules: dict[str, nn.Module], linears: list, calls: dict[str, int]) -> dict | None:
    """One traced attention module as a site dict, or None when its head dim cannot be told."""
    name, mod, H = rec["name"], modules[rec["name"]], rec["n_heads"]
    inside = [lin for running, lin in linears[rec["after"]:rec.get("returned", len(linears))]
              if name in running or name == ""]
    D = rec.get("head_dim") or rec.get("out_dim") or _attr(mod, _HEAD_DIM_ATTRS)
    if D is None:
        dims = [lin.in_features // H for lin in inside if lin.in_features % H == 0]
        D = dims[-1] if dims else None
    if D is None:
        return None
    proj = [lin for lin in inside if lin.in_features == H * D]
    out_proj = proj[-1] if proj else _parent_projection(name, H * D, linears[rec.get("returned", len(linears)):])
    return dict(name=name, module=mod, n_heads=H, head_dim=D, out_proj=out_proj, calls=calls.get(name, 1))


def _parent_projection(name: str, width: int, after: list[tuple[tuple[str, ...], nn.Linear]]) -> nn.Linear | None:
    """The first Linear of in_features H * D that the attention module's parent runs after it returned."""
    if not name:
        return None
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    for running, lin in after:
        if parent not in running:
            return None  # the parent returned: what runs next is not its projection
        if lin.in_features == width:
            return lin
    return None


def trace_attention(model: nn.Module, example: Any = None) -> list[dict]:
    """The attention modules of one traced forward (Trace.sites); [] when the forward could not run."""
    return trace(model, example).sites
