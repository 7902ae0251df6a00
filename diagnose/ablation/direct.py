"""Direct effects: each head removed only on its direct path to the output (path patching to the logits).

A head's total effect (the sweep) counts everything its removal sets off, including later heads,
MLPs and norms that make up for it (self-repair: McGrath et al. 2023, the Hydra effect; Rushing &
Nanda 2024). Its direct effect freezes everything downstream at its clean value: every later attention
and MLP sublayer sees its clean input, and the head's change to the stream,

    delta = -W_O[h] (head_out[h] - fill[h])      # [B, T, d]; fill: the method's (0 for zero)

crosses the norms on its path (the adapter declares them: adapters/readout.py), each with its scale
frozen at its clean value, so each is linear in the change:

    delta <- gamma * (delta - mean(delta)) / sigma_clean      # LayerNorm; RMSNorm: gamma * delta / rms_clean

Pre-norm (GPT-2, LLaMA, the reference model) has one norm on the path, the final one, and its output
moves by the change (a pre-norm torch nn.TransformerEncoder without a final norm: none, and the encoder's
output moves); post-norm BERT has its own layer's two LayerNorms and both of every later layer's (a
post-norm torch encoder: norm1 and norm2 of its layer and every later one, then its final norm if any),
and the encoder's output moves. Then only the output layers run (the unembedding; pooler and classifier;
an MLM head). That needs no ablated forward at all: one clean pass per batch gives every head's output
and each norm's clean input; then each head costs the output layers only, K heads per forward with all
blocks replaying their clean outputs (prefix.py).

A model whose adapter declares no path (the generic adapter's: nanoGPT, minGPT, timm, x-transformers, ...), or
whose declared path does not apply, gets one from a traced forward (adapters/_stream.py), measured by clamping
every other sublayer at its clean output instead (direct_clamp.py); `readiness` says which, or why neither.
Each norm is frozen by the form its adapter declares (adapters/norms.py), never by its class name here.

Freezing the norms' scales (NORM) is how Rushing & Nanda 2024 measure direct effects: a norm's rescaling
after a head is removed is itself a mechanism of self-repair, and freezing it puts that share in
`self_repair` instead of hiding it in the direct effect (Heimersheim & Nanda 2024 name the choice as one
to state).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from ..adapters import StreamPlan, hooks, stream_plan
from ..adapters.base import AttentionSite
from ..adapters.layout import stored_in_out
from ..adapters.norms import NormForm, declared
from ..adapters.readout import ResidualPath, hidden_of, moved, residual_path
from ..errors import ConfigError
from ..objectives import call_model, logits_of, score
from .direct_clamp import Clamped, Passes
from .prefix import repeat_batch, replay
from .sweep import Ablated, Clean, Sweep, _kl_sums, _same

NORM = ("frozen: every norm on a head's path to the output (pre-norm: the final norm; post-norm BERT or torch "
        "encoder: its layer's norms and every later layer's, then a final norm if any; a traced path: every norm of "
        "the layers and the final norms) has its scale (1 / sigma of its clean input) held at its clean value, as "
        "Rushing & Nanda 2024 measure direct effects, so the norms' own rescaling when a head is removed counts as "
        "self-repair")


def readiness(sites: Sequence[AttentionSite], model: nn.Module, example: Any = None
              ) -> tuple[list[ResidualPath] | StreamPlan | None, str | None]:
    """(each site's declared path to the output, or the plan a traced forward on `example` found, None)
    when direct effects can be measured, else (None, one line why)."""
    if not sites:
        return None, "no attention sites"
    try:
        paths = [residual_path(site.adapter, model, site) for site in sites]
        for site, path in zip(sites, paths):
            for norm in path.norms:
                norm_form(site.adapter, norm)  # a norm we cannot freeze: say so now rather than at the first batch
            head_weights(site)
        return paths, None
    except ConfigError as e:
        why = str(e)
    declares = any(hasattr(site.adapter, "residual_path") or hasattr(site.adapter, "final_norm") for site in sites)
    try:
        return stream_plan(getattr(model, "_orig_mod", model), sites, example), None
    except ConfigError as e:
        return None, (f"{why}; nor could a traced forward find one: {e}" if declares else str(e))


def passes(sweep: Sweep, paths: list[ResidualPath] | StreamPlan) -> "Direct | Clamped":
    """The direct-effect passes for what readiness found: the declared paths' or the traced plan's."""
    return Clamped(sweep, paths) if isinstance(paths, StreamPlan) else Direct(sweep, paths)


def path_of(paths: list[ResidualPath] | StreamPlan) -> str:
    """How the heads' paths were had, in words (result.direct["path"])."""
    if isinstance(paths, StreamPlan):
        return paths.describe()
    return "declared by the adapter (diagnose/adapters/readout.py)"


def head_weights(site: AttentionSite) -> torch.Tensor:
    """Each head's slice of the output projection, without its bias, as the adapter declares it stored
    (layout.stored_in_out: GPT-2's Conv1D keeps [in, out], a Linear [out, in]).  # [H, D, d]"""
    proj, H, D = site.out_proj, site.n_heads, site.head_dim
    w = getattr(proj, "weight", None)
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        w = w.detach() if stored_in_out(site) else w.detach().t()  # [in, out]
        if w.shape[0] == H * D:
            return w.reshape(H, D, -1)
    raise ConfigError(f"{site.name}: its output projection is not a linear map of the heads side by side, so "
                      "direct effects are not measured")


def norm_form(adapter, norm: nn.Module) -> NormForm:
    """The norm's frozen form as its adapter (or register_norm) declares it (adapters/norms.py)."""
    form = declared(adapter, norm)
    if form is None:
        raise ConfigError(f"a norm on the path to the output is a {type(norm).__name__}, whose frozen form no adapter "
                          f"declares (diagnose.register_norm({type(norm).__name__}, ...) declares it), so direct "
                          "effects are not measured")
    return form


class Direct(Passes):
    """The direct-effect passes of one sweep (its gates, fills and replay); `run` returns an Accumulator
    whose 'ablated' outcomes are the direct-path ones, so the sweep's tests apply unchanged."""

    def verify(self, inputs: Any, labels: Any) -> str | None:
        """None: a declared path needs no check on the data (its adapter's tests make it)."""
        return None

    def __init__(self, sweep: Sweep, paths: Sequence[ResidualPath]):
        self.sweep, self.paths = sweep, list(paths)  # per site
        self.norms = list({id(n): n for path in paths for n in path.norms}.values())  # each once
        self.forms = {id(n): norm_form(site.adapter, n) for site, path in zip(sweep.sites, paths) for n in path.norms}
        self.weights = [head_weights(site) for site in sweep.sites]  # per site [H, D, d]
        self.replay_ok: bool | None = None  # checked on the first batch
        self.forwards = 0
        self.seconds = 0.0

    def _pass(self, inputs: Any, labels: Any, rows: torch.Tensor, heads: Sequence[int]) -> tuple[Clean, Ablated]:
        clean, outs, normed = self._clean(inputs, labels, rows)
        return clean, self._batch(clean, outs, normed, heads)

    def _clean(self, inputs: Any, labels: Any, rows: torch.Tensor
               ) -> tuple[Clean, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """The clean pass, recording each site's head outputs (per site [B, T, H, D]), block outputs, and
        each norm's input (by id(norm), [B, T, d]): the clean scale that the path freezes."""
        outs: dict[int, torch.Tensor] = {}
        normed: dict[int, list[torch.Tensor]] = {id(n): [] for n in self.norms}
        for s, gate in enumerate(self.sweep.gates):
            gate.observer = lambda head_out, s=s: outs.setdefault(s, head_out.detach())

        def record(norm: nn.Module):
            return lambda: norm.register_forward_pre_hook(lambda _m, args: normed[id(norm)].append(args[0].detach()))

        try:
            with hooks(*map(record, self.norms)):
                clean = self.sweep.clean(inputs, labels, grad=False, record=True, rows=rows)
        finally:
            for gate in self.sweep.gates:
                gate.observer = None
        calls = {len(v) for v in normed.values()}
        if calls - {1}:  # a path with no norm (pre-norm without a final norm) has nothing to check
            raise ConfigError(f"a norm on a head's path ran {sorted(calls)} times in one forward, not once, so its "
                              "clean scale is ambiguous and direct effects cannot be measured (--no-direct)")
        return clean, outs, {k: v[0] for k, v in normed.items()}

    def _batch(self, clean: Clean, outs: dict[int, torch.Tensor], normed: dict[int, torch.Tensor],
               heads: Sequence[int]) -> dict[int, Ablated]:
        out: dict[int, Ablated] = {}
        for s, ms in self._site_chunks(heads):
            out.update(self._chunk(clean, outs[s], normed, s, ms))
            if self.tick:
                self.tick()
        return out

    def _chunk(self, clean: Clean, head_out: torch.Tensor, normed: dict[int, torch.Tensor], s: int,
               ms: list[int]) -> dict[int, Ablated]:
        """Heads ms of site s, one forward of K = len(ms) replicas per draw of the method's fill."""
        gate, idx = self.sweep.gates[s], [self.sweep.heads[m][1] for m in ms]
        w = self.weights[s][idx].to(head_out.device, head_out.dtype)  # [K, D, d]
        outcomes = []
        for draw in range(self.sweep.draws):
            fill = None if gate.fill is None else gate.fill(head_out, clean.rows, draw)
            fill = None if fill is None else fill.to(head_out.device, head_out.dtype).expand_as(head_out)
            removed = head_out if fill is None else head_out - fill  # [B, T, H, D]
            delta = -torch.einsum("btkd,kde->kbte", removed[:, :, idx], w)  # [K, B, T, d]
            outcomes.append(self._outcome(clean, s, self._through(s, delta, normed)))
        loss_sum, correct, kl = (outcomes[0] if len(outcomes) == 1 else
                                 (torch.stack([o[i].double() for o in outcomes]).mean(0) for i in range(3)))
        return {m: Ablated(loss_sum[j], correct[j], float(kl[j])) for j, m in enumerate(ms)}

    def _through(self, s: int, delta: torch.Tensor, normed: dict[int, torch.Tensor]) -> torch.Tensor:
        """delta [K, B, T, d] carried through site s's norms in order, each frozen at its clean input [B, T, d]."""
        for norm in self.paths[s].norms:
            x = normed[id(norm)]  # on the norm's device (a model split over devices)
            delta = self.forms[id(norm)].change(norm, x, delta.to(x.device))
        return delta

    def _outcome(self, clean: Clean, s: int, change: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(loss_sum [K, B], correct [K, B], KL sums [K]) with site s's path output moved by change [K, B, T, d]."""
        K, B = change.shape[0], clean.batch
        if self.replay_ok is None:
            self.replay_ok = self._replay_reproduces(clean, s)
        logits = self._forward(clean, s, change.reshape(K * B, *change.shape[2:]), K)  # [K * B, ...]
        sc = score(logits, repeat_batch(clean.targets, K, B))
        return (sc.loss_sum.view(K, B), sc.correct.view(K, B),
                _kl_sums(clean, logits.reshape(K, B, *logits.shape[1:])))

    def _forward(self, clean: Clean, s: int, change: torch.Tensor | None, K: int) -> torch.Tensor:
        """K replicas of the batch, every block replaying its clean output (when that reproduces the clean
        logits), site s's path output moved by change [K * B, T, d] (None: not moved)."""
        recorder = self.sweep.recorder
        blocks = ([i for i in range(len(recorder.blocks)) if recorder.calls.get(i) == 1]
                  if self.replay_ok and recorder is not None and clean.recorded is not None else [])

        def move(_m, _args, out):
            hidden = hidden_of(out)
            assert hidden is None or hidden.shape == change.shape, \
                f"path output {tuple(hidden.shape)} vs change {tuple(change.shape)}"
            return moved(out, change)

        with torch.no_grad(), hooks(*([] if change is None else [lambda: self.paths[s].output.register_forward_hook(
                move)])), (replay(recorder, clean.recorded, blocks, K, clean.batch) if blocks else _nothing()), \
                self.sweep.scoring(clean.index):
            logits = logits_of(call_model(self.sweep.model, repeat_batch(clean.inputs, K, clean.batch)))
        self.forwards += 1
        return logits

    def _replay_reproduces(self, clean: Clean, s: int) -> bool:
        """With no change, the replaying forward gives the clean logits (else every block recomputes)."""
        self.replay_ok = True
        logits = self._forward(clean, s, None, 1)
        width = max(site.n_heads * site.head_dim for site in self.sweep.sites)
        return _same(logits, clean.logits, len(self.sweep.sites), width)


@contextmanager
def _nothing() -> Iterator[None]:
    yield
