"""How a norm is frozen on a head's direct path: each norm's linear form with its clean scale.

A head's direct effect (ablation/direct.py) carries its change to the stream through every norm on its
path with the norm's scale held at its clean input's, so that the norm is linear in the change:

    LayerNorm (centred):   change(x, delta) = g * (delta - mean(delta)) / sqrt(var(x) + eps)
    RMSNorm:               change(x, delta) = g * delta / sqrt(mean(x^2) + eps)

where g is the norm's gain: its weight, or 1 + its weight (Gemma's RMSNorm), or 1 without one. A
`NormForm` declares which: whether the norm centres, the gain's offset, and where its weight and eps sit.

Who declares: torch's own nn.LayerNorm and nn.RMSNorm are built in; a family adapter declares its own
classes with a method `norm_form(module) -> NormForm | None` (the family check lives there, e.g. the
LLaMA adapter's RMSNorms and Gemma's (1 + w) one); `register_norm(cls, form)` declares a class for every
model. A norm of a model found without a declared adapter is recognised by its behaviour instead
(`infer`): a leaf module that is unchanged when its input doubles, whose output one form reproduces from
its own weight. A norm nothing declares stops the direct effects with one line naming its class and
`register_norm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..registry import Registry

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "norm_eps")
_WEIGHT_ATTRS = ("weight", "gamma", "g", "scale")
_BIAS_ATTRS = ("bias", "beta", "b")


@dataclass(frozen=True)
class NormForm:
    """One kind of norm, linearised with its clean scale (module docstring).

    centred: subtracts the mean over the last dim first (LayerNorm); gain_offset: the gain is
    offset + weight (Gemma: 1); weight / eps: the attribute holding the gain [d] and the epsilon
    (None: the first of the usual names the module has; an eps attribute that is None means the
    input dtype's machine epsilon, as torch's nn.RMSNorm does); default_eps: where the module keeps none.
    """

    name: str
    centred: bool
    gain_offset: float = 0.0
    weight: str | None = None
    eps: str | None = None
    default_eps: float = 1e-5

    def gain(self, norm: nn.Module) -> torch.Tensor | None:
        """The gain the normalised input is multiplied by, or None (1).  # [d]"""
        w = _param(norm, (self.weight,) if self.weight else _WEIGHT_ATTRS)
        if w is None:
            return None
        return w.float() + self.gain_offset

    def epsilon(self, norm: nn.Module, dtype: torch.dtype) -> float:
        for name in (self.eps,) if self.eps else _EPS_ATTRS:
            if hasattr(norm, name):
                value = getattr(norm, name)
                return torch.finfo(dtype).eps if value is None else float(value)
        return self.default_eps

    def scale(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """1 / sigma of the clean input x (the frozen part).  # [..., 1]"""
        x = x.float()
        spread = x.var(-1, unbiased=False, keepdim=True) if self.centred else x.pow(2).mean(-1, keepdim=True)
        return torch.rsqrt(spread + self.epsilon(norm, x.dtype))

    def change(self, norm: nn.Module, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """What the norm adds to its output when its input x [..., d] moves by delta [..., d] (or [K, ..., d])."""
        d = delta.float()
        if self.centred:
            d = d - d.mean(-1, keepdim=True)
        out = d * self.scale(norm, x)
        g = self.gain(norm)
        return out if g is None else out * g

    def output(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The norm's own output on x by this form (with its bias), to recognise a norm by its behaviour."""
        out = self.change(norm, x, x)
        bias = _param(norm, _BIAS_ATTRS)
        return out if bias is None else out + bias.float()


LAYER_NORM = NormForm("LayerNorm", centred=True)
RMS_NORM = NormForm("RMSNorm", centred=False)
ONE_PLUS_RMS_NORM = NormForm("RMSNorm with gain 1 + weight", centred=False, gain_offset=1.0)
ONE_PLUS_LAYER_NORM = NormForm("LayerNorm with gain 1 + weight", centred=True, gain_offset=1.0)
KNOWN_FORMS = (LAYER_NORM, RMS_NORM, ONE_PLUS_RMS_NORM, ONE_PLUS_LAYER_NORM)

@dataclass(frozen=True)
class NormClass:
    """A norm class and its frozen form, as registered for every model (register_norm)."""

    cls: type
    form: NormForm

    @property
    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


# class -> form for every model (the one registry pattern, diagnose/registry.py); torch's own norms built in
REGISTRY: Registry[NormClass] = Registry(
    "norm class", builtins=lambda: (NormClass(nn.LayerNorm, LAYER_NORM), NormClass(nn.RMSNorm, RMS_NORM)))


def register_norm(cls: type, form: NormForm) -> NormForm:
    """Declare the frozen form of every module of class `cls` (and its subclasses), for every model
    (a later declaration for the same class replaces the earlier)."""
    REGISTRY.register(NormClass(cls, form), replace=True)
    return form


def unregister_norm(cls: type) -> None:
    """Undo register_norm (tests and notebooks); the built-in torch classes stay."""
    if cls not in (nn.LayerNorm, nn.RMSNorm):
        REGISTRY.unregister(NormClass(cls, LAYER_NORM).name, missing_ok=True)


def declared(adapter: Any, norm: nn.Module) -> NormForm | None:
    """The norm's form as its adapter declares it, else as registered for its class; None when undeclared."""
    own = getattr(adapter, "norm_form", None)
    form = own(norm) if callable(own) else None
    if form is not None:
        return form
    forms = {entry.cls: entry.form for entry in REGISTRY}
    for cls in type(norm).__mro__:
        if cls in forms:
            return forms[cls]
    return None


def looks_like_norm(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> bool:
    """A leaf module whose output y (the shape of its input x) stays the same when x doubles: it
    normalises (LayerNorm, RMSNorm, ScaleNorm ...), where a Linear, an activation or an Identity does not."""
    if any(True for _ in module.children()) or x.shape != y.shape or x.dim() < 2 or not x.is_floating_point():
        return False
    if any(p.dim() > 1 for p in module.parameters()):  # a norm holds a gain and a bias [d] at most
        return False
    rows = y.reshape(-1, y.shape[-1]).float()
    if float(x.float().abs().max()) == 0.0 or bool((rows == rows[:1]).all()):  # constant rows: a bias, not a norm
        return False
    big = _loud(x)  # a norm's eps is negligible next to this input's spread, so only its scale can move it
    with torch.no_grad():
        once, doubled = module(big), module(2 * big)
    if not (isinstance(once, torch.Tensor) and isinstance(doubled, torch.Tensor) and once.shape == y.shape):
        return False
    return _close(doubled, once) and not _close(2 * big, big)


def infer(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> NormForm | None:
    """The known form whose output reproduces the module's own on its input x [..., d] (y: that output),
    compared on x spread out so that the eps, which the module may keep where no attribute shows, does not
    matter; the frozen change then uses the eps the module shows, else the form's default."""
    big = _loud(x)
    with torch.no_grad():
        want = module(big)
        for form in KNOWN_FORMS:
            w = form.gain(module)
            if (w is None or w.shape == x.shape[-1:]) and _close(form.output(module, big), want):
                return form
    return None


def _loud(x: torch.Tensor) -> torch.Tensor:
    """x with each row's spread around its mean at 10 (its mean kept): a scale-free norm reads it as x."""
    x = x.detach()
    mean = x.float().mean(-1, keepdim=True)
    spread = (x.float() - mean).pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
    return (mean + (x.float() - mean) / spread * 10.0).to(x.dtype)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    scale = max(float(b.abs().max()), 1.0)
    eps = torch.finfo(b.dtype if b.dtype in (torch.float16, torch.bfloat16) else torch.float32).eps
    return float((a - b).abs().max()) <= 1e3 * eps * scale


def _param(module: nn.Module, names) -> torch.Tensor | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor) and value.dim() == 1:
            return value.detach()
    return None
