"""The forward passes of an ablation sweep, all through the gates of gate.py.

Per batch: one clean pass (optionally with d loss / d gate, and recording block outputs for
prefix reuse), then the ablations, `replication` heads per forward: the batch is replicated K
times and replica k closes one head (plan.py chooses K, and the batch, so that one forward
fits the memory and, on a CPU, the cache). Blocks that finish before the ablated layer starts
replay their clean output (prefix.py). Everything is summed per example so that the
significance tests can pair clean and ablated results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .._tolerance import close, model_size
from ..adapters.base import AttentionSite
from ..errors import DiagnoseError
from ..objectives import IGNORE, call_model, logits_of, require_finite, score, targets_for
from .batches import batch_size_of
from .gate import Gate, close_heads
from .prefix import Recorder, repeat_batch, replay, take_rows
from .scored import ScoredOnly, positions


@dataclass
class Clean:
    """One batch after its clean pass."""

    inputs: Any
    targets: torch.Tensor  # [B] or [B, T], IGNORE where not scored
    batch: int
    loss_sum: torch.Tensor  # [B]
    correct: torch.Tensor  # [B]
    count: torch.Tensor  # [B]
    logits: torch.Tensor  # [B, ...]
    logp: torch.Tensor  # [U, V] clean log-probabilities of the scored units
    grads: list[torch.Tensor] | None  # per site [B, H]: d loss_sum[b] / d gate[b, h]
    recorded: dict[int, Any] | None = None  # block index -> its clean output, for prefix replay
    rows: torch.Tensor | None = None  # [B] the data set's index of each example, when known
    index: torch.Tensor | None = None  # [B, S] the scored positions the logits and targets keep (scored.py)
    wrong: torch.Tensor | None = None  # like targets: the wrong answer per unit, when the data names one
    diff_sum: torch.Tensor | None = None  # [B] logit(label) - logit(wrong), summed over diff_count [B] units
    diff_count: torch.Tensor | None = None

    def nbytes(self) -> int:
        """Memory this batch holds (to decide whether --fast may keep it for the verification)."""
        held = [self.logits, self.logp, *_tensors((self.recorded or {}).values())]
        return sum(t.numel() * t.element_size() for t in held)


@dataclass
class Ablated:
    """One head on one batch."""

    loss_sum: torch.Tensor  # [B]
    correct: torch.Tensor  # [B]
    kl_sum: float  # sum over scored units of KL(clean || ablated)
    diff_sum: torch.Tensor | None = None  # [B] logit difference label - wrong, when the data names wrong answers


class Sweep:
    """The passes of one sweep through the gates of `sites`. `closed`: (site, head) pairs shut in every
    pass, the base the clean pass and each ablation start from (prune's removed heads, a group closed
    together); the ablations close one more head each on top of it."""

    def __init__(self, model: torch.nn.Module, sites: Sequence[AttentionSite], gates: Sequence[Gate], task: str,
                 *, reuse: bool = True, replication: int | None = None, closed: Sequence[tuple[int, int]] = (),
                 scored: ScoredOnly | None = None):
        self.model, self.sites, self.gates, self.task = model, list(sites), list(gates), task
        self.scored = scored  # logits at the scored positions only (scored.py); None: at every position
        self.closed = list(closed)
        self.draws, self.draw = 1, 0  # forwards per ablation whose outcomes are averaged (methods.py), and which
        self.heads = [(s, h) for s, site in enumerate(self.sites) for h in range(site.n_heads)]  # global order
        blocks = sites[0].adapter.blocks(model) if reuse and sites else []
        self.recorder = Recorder(blocks, self.sites) if blocks else None
        self.reuse = self.recorder is not None
        self.checked: set[int] = set()  # sites whose replay was verified on a clean replica
        # heads closed per ablation forward (None: all of a layer's heads in one forward)
        self.replication = replication or max((site.n_heads for site in self.sites), default=1)
        self.forwards = 0
        self.examples_forwarded = 0
        # the data set's wrong answers [N] or [N, T] (data.wrong_labels), read by each batch's rows; None: none
        self.wrong: torch.Tensor | None = None

    # ---- passes ----------------------------------------------------------------------------

    def clean(self, inputs: Any, labels: Any, *, grad: bool, record: bool, rows: torch.Tensor | None = None) -> Clean:
        """The forward of one batch with only the base `closed` heads shut (with d loss / d gate when grad).
        rows: [B] the data set's index of each example, for methods whose fill depends on the example."""
        B = batch_size_of(inputs)
        targets = targets_for(self.task, inputs, labels)
        wrong = None if self.wrong is None or rows is None else self.wrong[rows.cpu()].to(targets.device)
        index, targets = self._scored_positions(inputs, targets)
        if index is not None and wrong is not None:
            wrong = wrong.gather(1, index)  # the wrong answers at the kept positions, as the targets  # [B, S]
        base = close_heads(self.n_heads, self.closed, B, device=targets.device)
        scales = [(torch.ones(B, site.n_heads, device=targets.device) if s is None else s).requires_grad_(grad)
                  for site, s in zip(self.sites, base)]  # [B, H] per site
        for gate, scale in zip(self.gates, scales):
            gate.scale, gate.calls, gate.rows, gate.draw = scale, 0, rows, self.draw
        recording = self.recorder.recording() if (record and self.reuse) else _nothing()
        try:
            with torch.set_grad_enabled(grad), recording, self.scoring(index):
                logits = logits_of(call_model(self.model, inputs))
                require_finite(self.model, logits.detach(), "with heads closed" if self.closed else
                               "on the data, before any head is ablated")
                sc = score(logits, targets.to(logits.device), wrong)
            silent = [s for s, g in enumerate(self.gates) if g.calls == 0]
            if silent:
                self.silent(silent[0])
            grads = None
            if grad:
                grads = torch.autograd.grad(sc.loss_sum.sum(), scales, allow_unused=True)
                grads = [torch.zeros_like(s) if g is None else g.detach() for g, s in zip(grads, scales)]
        finally:
            for gate in self.gates:
                gate.scale = gate.rows = None
        self.count_forward(B)
        logits = logits.detach()
        return Clean(inputs, targets, B, sc.loss_sum.detach(), sc.correct, sc.count, logits,
                     _unit_logp(logits, targets), grads,
                     self.recorder.outputs if (record and self.reuse) else None, rows, index, wrong,
                     None if sc.diff_sum is None else sc.diff_sum.detach(), sc.diff_count)

    def scoring(self, index: torch.Tensor | None) -> Any:
        """Context: the output layer makes logits at positions `index` [B, S] only (None: at every position)."""
        return _nothing() if index is None or self.scored is None else self.scored.at(index)

    def _scored_positions(self, inputs: Any, targets: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(index [B, S], targets [B, S]) when the logits can be cut to the scored positions, else (None, targets)."""
        cut = positions(targets) if self.scored is not None and self.scored.on else None
        if cut is None:
            return None, targets
        observers = [g.observer for g in self.gates]  # the check's forwards are not the clean pass
        try:
            for g in self.gates:
                g.observer = None
            ok = self.scored.check(self.model, self.sites, take_rows(inputs, 0, 1, batch_size_of(inputs)), cut[0])
        finally:
            for g, o in zip(self.gates, observers):
                g.observer = o
        return cut if ok else (None, targets)

    def ablate(self, clean: Clean, head_ids: Sequence[int], tick=None) -> dict[int, Ablated]:
        """Exact ablation of each head in head_ids (global indices) on one clean batch."""
        out: dict[int, Ablated] = {}
        by_site: dict[int, list[int]] = {}
        for m in head_ids:
            by_site.setdefault(self.heads[m][0], []).append(m)
        k = self.replication
        for s, ms in by_site.items():
            for i in range(0, len(ms), k):
                out.update(self._ablate_chunk(clean, s, ms[i:i + k]))
            if tick:
                tick(len(ms))  # a step per head
        return out

    # ---- internals -------------------------------------------------------------------------

    def _ablate_chunk(self, clean: Clean, s: int, ms: list[int]) -> dict[int, Ablated]:
        blocks = self.recorder.reusable(s) if (self.reuse and clean.recorded is not None) else []
        if blocks and s not in self.checked:
            self.checked.add(s)
            if not self._replay_reproduces(clean, s, blocks):
                self.reuse = False  # a block with side effects or extra outputs: recompute everything
                blocks = []
        outcomes = []  # per draw: loss_sum [K, B], correct [K, B], kl [K], logit difference [K, B] or None
        try:
            for draw in range(self.draws):
                self.draw = draw
                outcomes.append(self._outcome(clean, s, ms, blocks))
        finally:
            self.draw = 0
        if len(outcomes) == 1:
            loss_sum, correct, kl, diff = outcomes[0]
        else:  # a random fill's draws, averaged per example
            loss_sum, correct, kl, diff = (None if outcomes[0][i] is None else
                                           torch.stack([o[i].double() for o in outcomes]).mean(0) for i in range(4))
        return {m: Ablated(loss_sum[k], correct[k], float(kl[k]), None if diff is None else diff[k])
                for k, m in enumerate(ms)}

    def _outcome(self, clean: Clean, s: int, ms: list[int], blocks: list[int]) -> tuple[torch.Tensor, ...]:
        """One forward of K = len(ms) replicas, replica k closing head ms[k]: (loss_sum [K, B], correct
        [K, B], KL sums [K], logit difference sums [K, B] or None)."""
        logits = self._forward(clean, clean.inputs, clean.recorded, clean.batch, s, list(ms), blocks)  # [K, B, ...]
        K = len(ms)
        flat = logits.reshape(K * clean.batch, *logits.shape[2:])
        wrong = None if clean.wrong is None else repeat_batch(clean.wrong, K, clean.batch)
        sc = score(flat, repeat_batch(clean.targets, K, clean.batch), wrong)
        diff = None if sc.diff_sum is None else sc.diff_sum.view(K, clean.batch)
        return sc.loss_sum.view(K, clean.batch), sc.correct.view(K, clean.batch), _kl_sums(clean, logits), diff

    def _replay_reproduces(self, clean: Clean, s: int, blocks: list[int]) -> bool:
        """Two clean replicas of the batch's first example, replaying `blocks`, give its clean logits.

        One example, not the whole batch: the check runs once per layer, and a check as large as
        the batch would cost a whole extra forward per layer when one head is closed per forward.
        """
        B = clean.batch
        recorded = {i: take_rows(clean.recorded[i], 0, 1, B) for i in blocks}
        logits = self._forward(clean, take_rows(clean.inputs, 0, 1, B), recorded, 1, s, [None, None], blocks)
        return all(_same(logits[k], clean.logits[:1], *model_size(self.sites)) for k in range(2))

    def _forward(self, clean: Clean, inputs: Any, recorded: dict[int, Any] | None, B: int, s: int,
                 targets: list[int | None], blocks: list[int]) -> torch.Tensor:
        """K = len(targets) replicas of `inputs` (B examples of `clean`, recorded: their block outputs),
        replica k closing head targets[k] (None: none) on top of the base `closed`.  # [K, B, ...]"""
        K = len(targets)
        replicas = [None if m is None else self.heads[m] for m in targets]
        rows = None if clean.rows is None else repeat_batch(take_rows(clean.rows, 0, B, clean.batch), K, B)  # [K * B]
        try:
            scales = close_heads(self.n_heads, self.closed, B, replicas, device=clean.targets.device)
            for gate, scale in zip(self.gates, scales):
                gate.scale, gate.rows, gate.draw = scale, rows, self.draw
            index = None if clean.index is None else take_rows(clean.index, 0, B, clean.batch)
            with torch.no_grad(), replay(self.recorder, recorded, blocks, K, B) if blocks else _nothing(), \
                    self.scoring(index):
                logits = logits_of(call_model(self.model, repeat_batch(inputs, K, B)))
        finally:
            for gate in self.gates:
                gate.scale = gate.rows = None
        self.count_forward(K * B)
        return logits.reshape(K, B, *logits.shape[1:])  # [K, B, ...]

    @property
    def n_heads(self) -> list[int]:
        return [site.n_heads for site in self.sites]

    def count_forward(self, n: int) -> None:
        """One more forward of n examples (the timing figures and prune's count read these)."""
        self.forwards += 1
        self.examples_forwarded += n

    def silent(self, s: int) -> None:
        """Raise for the gate of site s, which a forward never reached: its adapter is wrong."""
        raise DiagnoseError(f"the head gate on {self.sites[s].name!r} was never applied during a forward; its "
                            "adapter cannot reach the heads (register an adapter: diagnose/adapters/base.py)")


def _unit_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Clean log-probabilities of the scored units.  # [U, V]"""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    return F.log_softmax(flat[targets.reshape(-1) != IGNORE], dim=-1)


def _kl_sums(clean: Clean, logits: torch.Tensor) -> torch.Tensor:
    """Sum over scored units of KL(clean || ablated), per replica.  logits [K, B, ...] -> [K]"""
    K = logits.shape[0]
    valid = clean.targets.reshape(-1) != IGNORE  # [B * T] or [B]
    flat = logits.reshape(K, -1, logits.shape[-1])[:, valid].float()  # [K, U, V]
    logq = F.log_softmax(flat, dim=-1)
    p = clean.logp.exp()[None]  # [1, U, V]
    return (p * (clean.logp[None] - logq)).sum((1, 2))


def _same(a: torch.Tensor, b: torch.Tensor, depth: int, width: int) -> bool:
    """Equal up to the rounding a different batch size may cause (the tolerance policy of
    diagnose/_tolerance.py, for the model's depth and width; half precision by its own eps)."""
    dtype = b.dtype if b.dtype in (torch.float16, torch.bfloat16, torch.float64) else torch.float32
    return close(a.float(), b.float(), depth=depth, width=width, dtype=dtype)[0]


def _tensors(objs) -> list[torch.Tensor]:
    out = []
    for o in objs:
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, (tuple, list)):
            out.extend(_tensors(o))
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
