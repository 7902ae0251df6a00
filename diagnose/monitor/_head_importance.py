"""Heads over training: each head's importance and role on sampled steps, and the in-context loss.

- heads (per head, attention steps): `importance`, Michel et al. 2019's |d loss / d gate_h| of a
  head gate at 1, without a gate: the first-order Taylor term sum over positions of
  <head output, d loss / d head output>, read from the backward the user already runs (a tensor
  hook on the per-head outputs the adapter's `intervene` site hands over, entered on sampled steps
  only: no extra forward, no extra backward). Per example b it is |sum_t,d x * dL/dx|, summed over
  the batch: with the loss the batch mean that is the mean over examples of |d L_b / d gate_h|,
  Michel's estimator. Beside it the role shares of the same forwards (first_token, prev_token,
  induction, duplicate_token, statistics.py), the last two where the model's input carries token ids.
- icl (the model, attention steps): Olsson et al. 2022's in-context learning score, the mean
  next-token loss at late positions (the last quarter) minus that at early ones (the first
  quarter, position 0 left out), from the model's [B, T, V] output against its own input ids shifted
  by one (a causal LM). It drops when induction heads form (the phase change, _head_events.py).

Under torch.compile neither is sampled: the intervene hook and the tensor hooks would break the
graph, and the icl hook on the output logits would be a graph of its own. A model given compiled
gets no hook of these at all; a model compiled after the monitor was attached keeps one model
pre-hook and one forward hook that return at once while dynamo traces them (nothing in the graph,
no guard that changes), and nothing is sampled once a forward was traced (ActivationWatch.traced).
The hooks on the heads are put in place by that pre-hook, at the start of a sampled step's first
eager forward, never before a forward whose compilation is not yet known. No warning: the signals
the run lacks, and why, are what `diagnose stats` says (_lacking.py).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F

from ..stat_context import BatchContext
from ._head_events import ROLE_STATS
from ._measure import Measurement, StepInputs, record_field as _f
from ._probes_logits import _logits

HEAD_ROWS = ("importance",) + ROLE_STATS
ICL_ROWS = ("icl_early", "icl_late", "icl_score")


class HeadProbe:
    """On sampled steps: per site [5, H], the importance and the role shares (see the module)."""

    def __init__(self, monitor: Any):
        from ..attention_stats import HeadStats

        self.model, self.sites, self.site_names = monitor.model, monitor.sites, monitor.site_names
        self._acts = monitor.probe("activations").watch  # its pre-hook keeps the attention_mask
        self.off = bool(monitor.compiled)  # a model given compiled: no hook of this measurement at all
        self._stack: ExitStack | None = None
        self.ids: torch.Tensor | None = None  # [B, T] token ids of the current forward, or None
        self.want = False  # this step is sampled: the pre-hook puts the heads' hooks in place
        self._handle = None
        self._stats = lambda: [HeadStats(s.n_heads, names=ROLE_STATS) for s in self.sites]
        self._reset()
        if self.off:
            return
        monitor.probe("attention").watch.readers.append(self._read)
        self._handle = self.model.register_forward_pre_hook(self._pre, with_kwargs=True)

    @property
    def traced(self) -> bool:
        """Whether a forward was traced by dynamo (compiled after the monitor was attached): then never sampled."""
        return self.off or self._acts.traced

    def _reset(self) -> None:
        self._imp: list[torch.Tensor | None] = [None] * len(self.sites)  # per site [H] on the device
        self._roles = self._stats()
        self._ran = [False] * len(self.sites)
        self.ran: list[bool] = []

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        self.want = bool(sampled) and not self.off  # the hooks come with the step's first eager forward

    def _pre(self, _module, args, kwargs) -> None:
        if torch.compiler.is_compiling():
            return  # traced by dynamo: nothing in the graph (and the block hooks mark the model traced)
        if self._stack is None:
            if not self.want or self.traced:
                return
            self._enter()
        inputs = kwargs if "input_ids" in kwargs else (args[0] if args else None)
        self.ids = BatchContext.of(inputs).input_ids

    def _enter(self) -> None:
        stack = ExitStack()
        try:
            for i, site in enumerate(self.sites):
                stack.enter_context(site.adapter.intervene(site, self._watch(i)))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def _watch(self, i: int):
        def fn(heads: torch.Tensor) -> torch.Tensor:  # [B, T, H, D]
            self._ran[i] = True
            if torch.is_grad_enabled() and heads.requires_grad:
                x = heads.detach()

                def on_grad(g: torch.Tensor) -> None:  # g [B, T, H, D]: d loss / d head output
                    per_example = (x.float() * g.float()).sum((1, 3))  # [B, H]
                    imp = per_example.abs().sum(0)  # [H]
                    self._imp[i] = imp if self._imp[i] is None else self._imp[i] + imp
                heads.register_hook(on_grad)
            return heads
        return fn

    def _read(self, i: int, probs: Any) -> None:  # probs [B, H, Tq, Tk], from the attention probe's hooks
        if self._stack is None:
            return
        mask = self._acts.mask
        mask = mask if mask is not None and mask.shape == (probs.shape[0], probs.shape[-1]) else None
        ids = self.ids if self.ids is not None and self.ids.shape[0] == probs.shape[0] else None
        self._roles[i].update(probs, batch=BatchContext(mask, ids))

    def _close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
        self.ids = None

    def discard(self) -> None:
        self._close()
        self._reset()
        self.want = False

    def collect(self, inputs: StepInputs) -> list[torch.Tensor | None]:
        sampled = self._stack is not None
        self._close()
        self.want = False
        out: list[torch.Tensor | None] = []
        for site, imp, roles, ran in zip(self.sites, self._imp, self._roles, self._ran):
            if not sampled or not ran:
                out.append(None)
                continue
            nan = torch.full((site.n_heads,), math.nan)
            rows = [imp.float() if imp is not None else nan]
            for name in ROLE_STATS:
                s = roles.sums.get(name)
                rows.append(nan if s is None else (s / roles.counts[roles.denominators[name]].clamp_min(1.0)).float())
            dev = next((r.device for r in rows if r.device.type != "cpu"), rows[0].device)
            out.append(torch.stack([r.to(dev) for r in rows]))  # [5, H]
        self._reset()
        self.ran = [o is not None for o in out]
        return out

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        names = [n for n, r in zip(self.site_names, self.ran) if r]
        for site, unit in zip(names, units):
            into = record.setdefault("attention", {}).setdefault(site, {})
            for row in HEAD_ROWS:
                values = unit[row]
                if not all(math.isnan(v) for v in values):  # a share the data cannot give is left out
                    into[row] = values

    def remove(self) -> None:
        self._close()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()


class IclProbe:
    """On sampled steps: the next-token loss early and late in the sequence (see the module)."""

    def __init__(self, monitor: Any):
        self.model = monitor.model
        self.heads: HeadProbe = monitor.probe("heads")
        self._acts = monitor.probe("activations").watch
        self._seen: list[torch.Tensor] = []
        # one hook for good (not one per sampled step) that does nothing while dynamo traces it
        self._handle = None if self.heads.off else self.model.register_forward_hook(self._hook)

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        """Nothing to arm: the in-context loss is sampled with the heads, while their hooks are in place
        (HeadProbe._pre)."""

    def _hook(self, _module, _args, out) -> None:
        if torch.compiler.is_compiling() or self.heads._stack is None:
            return
        logits, ids = _logits(out), self.heads.ids
        if not torch.is_grad_enabled():
            return  # an evaluation inside a sampled step: not the training batch
        if logits is None or ids is None or logits.shape[:2] != ids.shape or ids.shape[1] < 8:
            return
        mask = self._acts.mask
        with torch.no_grad():
            self._seen.append(icl_losses(logits, ids.to(logits.device),
                                         mask if mask is not None and mask.shape == ids.shape else None))

    def _close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()

    def discard(self) -> None:
        self._seen = []

    def collect(self, inputs: StepInputs) -> torch.Tensor | None:
        seen, self._seen = self._seen, []
        if not seen:
            return None
        early, late = torch.stack(seen).mean(0).unbind()
        return torch.stack([early, late, late - early])[None]  # [1 unit, 3 rows]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        if units:
            record.update({k: units[0][k][0] for k in ICL_ROWS})

    def remove(self) -> None:
        self._close()


def icl_losses(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[2]: the mean next-token loss over the first and the last quarter of the predicted positions.
    logits [B, T, V] at each position, ids [B, T] (position t predicts ids[t + 1]); mask [B, T] 1 real."""
    B, T, V = logits.shape
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(B, T - 1)  # [B, T - 1]: the loss of predicting token t + 1
    w = torch.ones_like(ce) if mask is None else (mask[:, 1:] * mask[:, :-1]).to(ce.dtype)
    q = (T - 1) // 4
    early = slice(1, 1 + q)  # the prediction of token 1 from token 0 alone is left out
    late = slice(T - 1 - q, T - 1)
    return torch.stack([(ce[:, s] * w[:, s]).sum() / w[:, s].sum().clamp_min(1.0) for s in (early, late)])


HEADS = Measurement(
    "heads", HEAD_ROWS, "head", tuple(f"attention.*.{r}" for r in HEAD_ROWS), HeadProbe,
    fields=(_f("importance", "importance |dL/dgate|", per="head", plot=True),
            *(_f(r, f"{r.replace('_', ' ')} share", ".3f", per="head") for r in ROLE_STATS)))
ICL = Measurement("icl", ICL_ROWS, "model", ICL_ROWS, IclProbe,
                  fields=(_f("icl_early", "early-position loss"), _f("icl_late", "late-position loss"),
                          _f("icl_score", "in-context score (late - early)", plot=True)))
