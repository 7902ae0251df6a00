"""Two logit signals of the published instabilities, measured on the device with no host sync.

- attention_logit: per sampled attention site, the largest pre-softmax logit q.k * scale of
  each head over the step's visible (query, key) pairs. Attention-logit growth is the divergence
  qk-layernorm cures (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023). It is read from the
  q and k the adapters already keep to recompute SDPA's probabilities (`LazyProbs.scores`), so it
  is taken where the model calls scaled_dot_product_attention; where the model writes its own
  softmax, from the softmax's input, which the intercept and the traced hooks hand over
  (base.send_scores), and where a family's own hook holds the masked scores (the reference model's
  `attn.scores`, TransformerLens's `hook_attn_scores`), from there. An adapter that sees only the
  probabilities gives no `max_logit`, and `diagnose stats` says so (_lacking.py).
- logit_z: per logged step, the log-partition z = logsumexp(logits) of the model's output
  logits over the vocabulary, per position: its mean, the largest |z| and the mean of z^2 (what
  the z-loss of PaLM and Wortsman et al. 2023 penalises). Output-logit divergence shows as z
  drifting far from 0.
"""

from __future__ import annotations

import warnings

from typing import Any

import torch

from ..adapters import LazyProbs
from ..adapters.base import TRACED_HOOKS
from ._measure import Measurement, StepInputs, record_field as _f
from ._probes import _Quiet

_CHUNK = 1 << 22  # score elements per chunk: the max logit never holds more than this


def max_logit(probs: Any) -> torch.Tensor | None:
    """Per head, the largest visible pre-softmax logit of one SDPA call; None for a model's own
    softmax map (its logits come separately: max_of_scores).  # [H] float32 on the device, no sync"""
    if not isinstance(probs, LazyProbs):
        return None
    B, H, Tq, Tk = probs.shape
    step = max(1, _CHUNK // max(1, B * H * Tk))
    best = None
    for s in range(0, Tq, step):
        sc = probs.scores(s, min(Tq, s + step), narrow=True)  # [B, H, c, K]
        m = sc.amax(dim=(0, 2, 3))  # [H]
        best = m if best is None else torch.maximum(best, m)
    return best


def max_of_scores(scores: Any) -> torch.Tensor:
    """Per head, the largest logit of a model's own softmax input (masked entries are -inf or very
    negative, so they do not win), or of a LazyProbs.  # [H] float32 on the device, no sync"""
    if isinstance(scores, LazyProbs):
        return max_logit(scores)
    return scores.detach().amax(dim=(0, 2, 3)).float()  # [B, H, Tq, Tk] -> [H]


class AttentionLogitProbe(_Quiet):
    """On sampled steps: per site, per head, the largest pre-softmax logit (the max over the step's
    forwards). It reads the attention probe's hooks (AttentionWatch.readers) rather than entering
    watch_pattern itself: one set of hooks per site, sampled on the same steps, and under
    torch.compile kept in the graph the same way (or given up with it, with its warning). So it
    has no hooks of its own to arm or remove (_Quiet's)."""

    def __init__(self, monitor: Any):
        self.site_names = monitor.site_names
        watch = monitor.probe("attention").watch
        watch.readers.append(self._read)
        watch.score_readers.append(self._read_scores)
        self._seen: list[list[torch.Tensor]] = [[] for _ in self.site_names]
        self.ran: list[bool] = []
        if monitor.compiled and not TRACED_HOOKS and self.site_names:
            warnings.warn(f"diagnose: the max pre-softmax logit is not sampled under torch.compile on torch "
                          f"{torch.__version__}: this dynamo cannot trace the scores' hand-over (torch >= 2.13 "
                          "does). Lost: attention.<site>.max_logit and attention_logit_growth; the other "
                          "attention statistics are kept. Fix: torch >= 2.13, or sample from an eager run.",
                          RuntimeWarning, stacklevel=3)

    def _read(self, i: int, probs: Any) -> None:
        m = max_logit(probs)
        if m is not None:
            self._seen[i].append(m.float())

    def _read_scores(self, i: int, scores: Any) -> None:
        self._seen[i].append(max_of_scores(scores))

    def discard(self) -> None:
        self._seen = [[] for _ in self.site_names]

    def collect(self, inputs: StepInputs) -> list[torch.Tensor | None]:
        out = [torch.stack(s).amax(0)[None] if s else None for s in self._seen]  # per site [1, H]
        self._seen = [[] for _ in self.site_names]
        self.ran = [o is not None for o in out]
        return out

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        names = [n for n, r in zip(self.site_names, self.ran) if r]
        for site, unit in zip(names, units):
            record.setdefault("attention", {}).setdefault(site, {})["max_logit"] = unit["max_logit"]


def _logits(out: Any) -> torch.Tensor | None:
    """The output logits [B, T, V] of a forward: a tensor, a `.logits` attribute, or a tuple's first."""
    x = getattr(out, "logits", None)
    if x is None and isinstance(out, (tuple, list)) and out:
        x = out[0]
    if x is None:
        x = out
    return x if isinstance(x, torch.Tensor) and x.dim() == 3 and x.is_floating_point() else None


def z_stats(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[3]: mean z, max |z| and mean z^2 of z = logsumexp(logits, -1) over the (real) positions.
    logits [B, T, V]; mask [B, T] with 1 for real tokens. No sync."""
    z = torch.logsumexp(logits.detach().float(), dim=-1)  # [B, T]
    w = torch.ones_like(z) if mask is None else mask.to(z.dtype)
    n = w.sum().clamp_min(1.0)
    mean = (z * w).sum() / n
    sq = (z * z * w).sum() / n
    mx = (z.abs() * w).amax()
    return torch.stack([mean, mx, sq])  # [3]


class LogitZProbe:
    """A forward hook on the model: z statistics of its output logits on logged steps (pooled over
    forwards: the mean of the means and of z^2, the max of |z|)."""

    def __init__(self, monitor: Any):
        self.armed = True
        self._acts = monitor.probe("activations").watch  # its pre-hook keeps the attention_mask
        self._seen: list[torch.Tensor] = []
        # a hook on the whole model runs outside a compiled model's forward, so dynamo would trace
        # it as a graph of its own (a third graph beside the forward with and without the attention
        # hooks, each armed switch another): it runs eagerly, as it would without torch.compile
        self._handle = monitor.model.register_forward_hook(torch.compiler.disable(self._hook))

    def _hook(self, module, args, out) -> None:
        if not self.armed or not torch.is_grad_enabled():
            return
        x = _logits(out)
        if x is None:
            return
        mask = self._acts.mask
        self._seen.append(z_stats(x, mask if mask is not None and mask.shape == x.shape[:2] else None))

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        self.armed = logged

    def discard(self) -> None:
        self._seen = []

    def collect(self, inputs: StepInputs) -> torch.Tensor | None:
        if not self._seen:
            return None
        s = torch.stack(self._seen)  # [forwards, 3]
        self._seen = []
        return torch.stack([s[:, 0].mean(), s[:, 1].amax(), s[:, 2].mean()])[None]  # [1 unit, 3 rows]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        if units:
            record.update({k: units[0][k][0] for k in LOGIT_Z.rows})

    def remove(self) -> None:
        self._handle.remove()


ATTENTION_LOGIT = Measurement("attention_logit", ("max_logit",), "head", ("attention.*.max_logit",),
                              AttentionLogitProbe, reduce={"max_logit": "max"},
                              fields=(_f("max_logit", "max logit", per="head", plot=True),))
LOGIT_Z = Measurement("logit_z", ("z_mean", "z_abs_max", "z_sq_mean"), "model",
                      ("z_mean", "z_abs_max", "z_sq_mean"), LogitZProbe, reduce={"z_abs_max": "max"},
                      fields=(_f("z_mean", "mean z"), _f("z_abs_max", "max |z|"), _f("z_sq_mean", "mean z^2")))
