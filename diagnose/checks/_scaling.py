"""Scaling: are attention scores q.k / sqrt(d_k), and how large and saturated are they?

The test measures the scale itself instead of guessing it from the size of the scores (which
depends on training as much as on the scale: on the order task a correct trained model had
score std 18 and 82 % near one-hot rows in one layer, an unscaled one at init std 0.4 and none).
While each attention module runs, a TorchFunctionMode sees the q @ k^T product and the input
of the softmax; their ratio on unmasked entries is the scale c the module applies (with any
scalar folded into q or k before the product, e.g. `q = q_proj(x) * scaling` or `q *= scaling`, counted
in; the product is copied, so an in-place `scores /= c` does not change what it is compared with).
Masked entries are told apart by their ratio, not their size: every unmasked entry has ratio c,
while a fill (-inf, finfo.min, -1e9, -1e4) or an additive mask gives each masked entry its own.
For F.scaled_dot_product_attention c is its `scale` argument (default 1/sqrt(D)); torch's
nn.MultiheadAttention always applies 1/sqrt(D) (its logit std and saturation are not shown). A correct
layer has c * sqrt(d_k) = 1; a missing 1/sqrt(d_k) gives sqrt(d_k). Flagged when c * sqrt(d_k) > 2.

Cosine attention (qk-norm as in x-transformers' qk_norm: q and k l2-normalised, then a fixed or
learned temperature such as 10) scales on purpose: when every q and k row entering the product has
norm 1 (the operands are read at the q @ k^T call or SDPA), q.k is a cosine in [-1, 1] and the scale
is a temperature, reported as information with the logit spread it gives, not as a missing 1/sqrt(d_k).

Reported beside it per layer: the std of the pre-softmax logits over unmasked keys (within a
row log p = score - logsumexp, so it is the std of log p) and the share of saturated rows
(max weight > 0.99), against the sqrt(d_k) a unit-variance q and k would give unscaled.

What it cannot tell: a scale hidden in the projection weights (T5 folds 1/sqrt(d_k) into its
initialisation) reads as unscaled; fused kernels that never call softmax or SDPA in Python give
no measurement (skipped); a per-position score bias (ALiBi, T5 relative buckets) makes scores
no multiple of q.k, so such layers are left unmeasured rather than guessed. Saturation is
reported as information only: a trained head may rightly attend to one token (induction heads).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..objectives import call_model
from ..modes import eval_mode
from ._subject import Subject, device_of, inputs_for
from ._finding import Finding, SkipCheck

NAME = "scaling"
TOO_LARGE = 2.0  # c * sqrt(d_k) above this: scores are not divided by sqrt(d_k)
SATURATED = 0.99  # a row whose max weight exceeds this is near one-hot
SATURATED_SHARE = 0.5  # an info finding when more rows than this are saturated in a layer

_MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm, torch.einsum}
# in-place forms too: Falcon divides its scores with `scores /= math.sqrt(head_dim)`, others fold `q *= scale`
_MUL = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul_,
        torch.Tensor.__imul__}
_DIV = {torch.div, torch.Tensor.div, torch.Tensor.__truediv__, torch.Tensor.div_, torch.Tensor.__itruediv__}
_SHAPE = {torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.transpose, torch.transpose,
          torch.Tensor.permute, torch.permute, torch.Tensor.contiguous, torch.Tensor.split, torch.split,
          torch.Tensor.chunk, torch.chunk, torch.Tensor.unbind, torch.unbind, torch.Tensor.__getitem__,
          torch.Tensor.to, torch.Tensor.float, torch.Tensor.type_as, torch.Tensor.flatten, torch.Tensor.unflatten,
          torch.Tensor.expand, torch.Tensor.repeat_interleave, torch.repeat_interleave, torch.Tensor.clone}
_SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax, torch.special.softmax}

_FIX = ("Divide the attention scores by sqrt(d_k): scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim) "
        "(or use F.scaled_dot_product_attention, which does). Without it the dot products grow like sqrt(d_k), "
        "the softmax saturates and its gradients vanish (Vaswani et al. 2017, section 3.2.1).")


def _scalar(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.dtype.is_floating_point:
        return float(x)
    return None


class _ScoreMode(TorchFunctionMode):
    """Inside one attention module: pairs each softmax input with the q @ k^T product before it."""

    def __init__(self, site: Any, out: dict[str, list]):
        super().__init__()
        self.site, self.out = site, out
        self.factor: dict[int, tuple[torch.Tensor, float]] = {}  # id -> (tensor kept alive, scalar folded in)
        self.qk: tuple[torch.Tensor, float] | None = None

    def _f(self, t: Any) -> float:
        return self.factor[id(t)][1] if isinstance(t, torch.Tensor) and id(t) in self.factor else 1.0

    def _set(self, out: Any, f: float) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and f != 1.0:
                self.factor[id(t)] = (t, f)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the model's own result, untouched
        if func in _SHAPE and args:
            self._set(out, self._f(args[0]))
        elif func in _MUL or func in _DIV:
            a, b = (args + (kwargs.get("other"),))[:2]
            t, s = (a, _scalar(b)) if isinstance(a, torch.Tensor) and _scalar(b) is not None else (b, _scalar(a))
            if s is not None and isinstance(t, torch.Tensor) and t.numel() > 1 and s != 0:
                self._set(out, self._f(t) * (1.0 / s if func in _DIV else s))
        elif func in _MATMUL and isinstance(out, torch.Tensor) and out.dim() >= 3:
            ops = args[1:] if func is torch.einsum else args[:2]
            f = 1.0
            for o in ops:
                f *= self._f(o)
            unit = _unit_operands(func, args, ops, self._f)
            self.qk = (out.detach().clone(), f, unit)  # a copy: `scores /= c` would change an alias too
        elif func is F.scaled_dot_product_attention:
            self._sdpa(*args, **kwargs)
        elif func is F.multi_head_attention_forward:
            # torch's MHA reaches the mode as one call; it always scales by 1/sqrt(embed_dim / num_heads)
            E, H = args[0].shape[-1], (args[4] if len(args) > 4 else kwargs["num_heads"])
            self.out["scale"].append(torch.tensor([math.sqrt(H / E)]))
        elif func in _SOFTMAX and isinstance(out, torch.Tensor) and out.dim() >= 3:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim is not None and dim % out.dim() == out.dim() - 1:
                self._softmax(args[0], out)
        return out

    def _sdpa(self, q, k, v=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        from ..adapters import sdpa_probs

        c = (1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)) * self._f(q) * self._f(k)
        self.out["scale"].append(torch.tensor([c]))
        self.out["unit"].append(_is_unit(q, -1, self._f(q)) and _is_unit(k, -1, self._f(k)))
        self.out["probs"].append(sdpa_probs(q, k, attn_mask, is_causal, scale).cpu())

    def _softmax(self, scores: torch.Tensor, probs: torch.Tensor) -> None:
        self.out["probs"].append(probs.detach().float().cpu())
        if self.qk is None or self.qk[0].shape != scores.shape:
            return
        qk, f = self.qk[0].float(), self.qk[1]
        self.out["unit"].append(self.qk[2])
        s = scores.detach().float()
        ok = torch.isfinite(s) & (s > -1e20) & (s != 0) & (qk.abs() > 1e-3 * qk.abs().amax().clamp_min(1e-30))
        common = _common_ratio(s[ok] / qk[ok])
        if common is not None:
            self.out["scale"].append((common * f).cpu())
        self.qk = None


UNIT = 1e-3  # |norm - 1| below this on every q and k row: unit vectors (cosine attention, qk-norm)


def _is_unit(t: Any, dim: int, factor: float) -> bool:
    """Whether every vector of `t` along `dim`, the factor folded into it taken out, has norm 1."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
        return False
    norms = t.detach().float().norm(dim=dim) / abs(factor)
    return bool(((norms - 1).abs() < UNIT).all())


def _unit_operands(func: Any, args: tuple, ops: tuple, factor: Any) -> bool:
    """Whether both operands of the q @ k^T product are unit vectors along the summed axis: q's last
    and k^T's second-to-last for matmul; for einsum the letter both inputs share and the output lacks."""
    if len(ops) != 2:
        return False
    if func is not torch.einsum:
        return _is_unit(ops[0], -1, factor(ops[0])) and _is_unit(ops[1], -2, factor(ops[1]))
    eq = args[0] if isinstance(args[0], str) else None
    if eq is None or "->" not in eq or "..." in eq:
        return False
    ins, out = eq.replace(" ", "").split("->")
    a, b = ins.split(",") if ins.count(",") == 1 else ("", "")
    summed = [c for c in a if c in b and c not in out]
    if len(summed) != 1 or len(a) != ops[0].dim() or len(b) != ops[1].dim():
        return False
    return _is_unit(ops[0], a.index(summed[0]), factor(ops[0])) and _is_unit(ops[1], b.index(summed[0]), factor(ops[1]))


def _common_ratio(r: torch.Tensor, tol: float = 1e-3, share: float = 0.2) -> torch.Tensor | None:
    """The ratios score / (q.k) of the entries that share one ratio, the scale; None if none do.  # [n]

    Unmasked entries all have ratio c. Masked ones do not, whatever the convention: a fill F
    (-inf, finfo.min, -1e9, -1e4, 0) gives F / q.k and an additive mask m gives c + m / q.k, both
    different for every entry. So the largest group of ratios within `tol` of each other is the
    unmasked entries (a causal mask leaves more than half of them) -- where a threshold on the
    score would take a -1e4 fill for a score. Fewer than `share` of the entries alike (a per-position
    bias such as T5's buckets): no common ratio.
    """
    if r.numel() < 8:
        return None
    r, _ = r.flatten().sort()
    ends = torch.searchsorted(r, r + tol * r.abs(), right=True)  # [n] first index past each entry's group
    sizes = ends - torch.arange(r.numel())
    i = int(sizes.argmax())
    n = int(sizes[i])
    if n < 8 or n < share * r.numel():
        return None
    return r[i:i + n]


def _watch(module: torch.nn.Module, site: Any, out: dict[str, list]):
    """While active, every forward of `module` runs inside a _ScoreMode; undone in `finally`."""
    from ..adapters import mode_inside

    return mode_inside(module, lambda: _ScoreMode(site, out))


def _row_stats(probs: torch.Tensor) -> tuple[float, float]:
    """(median over rows of the std of log p over keys with p > 0, share of rows with max > 0.99)."""
    p = probs.reshape(-1, probs.shape[-1])  # [rows, Tk]
    live = p > 0
    n = live.sum(-1)
    rows = n >= 2
    if not bool(rows.any()):
        return math.nan, math.nan
    lp = torch.where(live, p.clamp_min(1e-45).log(), torch.zeros_like(p))
    mean = lp.sum(-1) / n.clamp_min(1)
    var = (((lp - mean[:, None]) * live) ** 2).sum(-1) / (n - 1).clamp_min(1)
    return float(var.sqrt()[rows].median()), float((p.amax(-1) > SATURATED)[rows].float().mean())


def check_scaling(subject: Subject, *, attention_module: str | None = None,
                  n_heads: int | None = None) -> list[Finding]:
    """Findings of the scaling check; raises SkipCheck when no layer could be measured."""
    ids = subject.rows  # [B, T]
    inputs = inputs_for(subject.info, ids, torch.ones_like(ids), device_of(subject.model))
    return measure_scaling(subject.model, inputs, attention_module=attention_module, n_heads=n_heads)


def measure_scaling(model: torch.nn.Module, inputs: Any, *, attention_module: str | None = None,
                    n_heads: int | None = None) -> list[Finding]:
    """The scaling check on any inputs the model takes (token ids, pixel values, audio features)."""
    from ..errors import DiagnoseError
    from ..sites import find_heads

    try:
        sites = find_heads(model, attention_module=attention_module, n_heads=n_heads, example=inputs)
    except DiagnoseError as exc:
        raise SkipCheck(f"no attention layer found ({exc})") from None
    seen = [{"scale": [], "probs": [], "unit": []} for _ in sites]
    from ..adapters import no_fastpath

    # the fused MHA / TransformerEncoder fast path runs no Python inside attention: switch it off
    with eval_mode(model), torch.no_grad(), no_fastpath(), ExitStack() as stack:
        for s, out in zip(sites, seen):
            stack.enter_context(_watch(s.module, s, out))
        call_model(model, inputs)
    ratios, stds, sats = [], [], []
    for s, out in zip(sites, seen):
        c = torch.cat(out["scale"]) if out["scale"] else None
        if c is not None and float(c.quantile(0.9) - c.quantile(0.1)) <= 0.05 * abs(float(c.median())):
            ratios.append(float(c.median()) * math.sqrt(s.head_dim))
        else:
            ratios.append(math.nan)  # not observed, or scores are no multiple of q.k (a position bias)
        rows = [p.reshape(-1, p.shape[-1]) for p in out["probs"]]  # [rows, Tk] each
        st, sat = _row_stats(torch.cat(rows)) if rows else (math.nan, math.nan)
        stds.append(st)
        sats.append(sat)
    measured = [r for r in ratios if not math.isnan(r)]
    if not measured:
        raise SkipCheck("no layer's scale could be measured (no softmax or scaled_dot_product_attention call "
                        "seen in Python, or scores carry a position bias)")
    evidence = {"scale_times_sqrt_dk_per_layer": ratios, "head_dim_per_layer": [s.head_dim for s in sites],
                "logit_std_per_layer": stds, "sqrt_dk_per_layer": [math.sqrt(s.head_dim) for s in sites],
                "saturated_share_per_layer": sats, "threshold": TOO_LARGE}
    found = []
    cosine = [bool(out["unit"]) and all(out["unit"]) for out in seen]  # unit-norm q and k: c is a temperature
    warm = [i for i, r in enumerate(ratios) if r > TOO_LARGE and cosine[i]]
    if warm:
        temps = [ratios[i] / math.sqrt(sites[i].head_dim) for i in warm]
        found.append(Finding(NAME, "info", f"Cosine (qk-normed) attention in {len(warm)} of {len(sites)} layers: q and k "
                             "are unit vectors, so the scale is a temperature, not a missing 1/sqrt(d_k)",
                             {**evidence, "layers": warm, "temperature_per_layer": temps, "unit_tolerance": UNIT},
                             f"Nothing to fix if intended: q.k lies in [-1, 1], so logits lie in [-c, c] (c = "
                             f"{max(temps):.3g} here); a c too small keeps attention near uniform (logit std above)."))
    bad = [i for i, r in enumerate(ratios) if r > TOO_LARGE and not cosine[i]]
    if bad:
        r, d = ratios[bad[0]], sites[bad[0]].head_dim
        what = ("are not divided by sqrt(d_k)" if abs(r / math.sqrt(d) - 1) < 0.25
                else f"are scaled {r:.3g}x more than 1/sqrt(d_k)")
        found.append(Finding(NAME, "warning", f"Attention scores {what} in {len(bad)} of {len(sites)} layers",
                             {**evidence, "layers": bad}, _FIX))
    small = [i for i, r in enumerate(ratios) if r < 1.0 / TOO_LARGE]
    if small:
        found.append(Finding(NAME, "info", f"Attention scores are scaled below 1/sqrt(d_k) in {len(small)} layers "
                             "(1/d_k as in muP?)", {**evidence, "layers": small},
                             "Fine if intended (muP uses 1/d_k); otherwise divide by sqrt(d_k)."))
    hot = [i for i, v in enumerate(sats) if not math.isnan(v) and v > SATURATED_SHARE]
    if hot:
        found.append(Finding(NAME, "info", f"Attention is near one-hot (max weight > {SATURATED}) in most rows of "
                             f"{len(hot)} layers", {**evidence, "layers": hot},
                             "Expected for heads that copy one token (induction, previous-token heads); if it "
                             "comes with poor training, check the 1/sqrt(d_k) scale, lower the learning rate "
                             "or add qk-norm."))
    return found
