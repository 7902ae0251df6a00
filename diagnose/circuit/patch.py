"""Path patching through the head gate: a forward in which chosen edges carry the sender's ablated value.

An edge s -> (r, p, h) is removed by moving receiver r's projection output block (p, h) by

    W_in[p, h] . norm_r.change(-(W_O[s] (out_s - fill_s)))      # [B, T, D], norm_r's scale frozen clean

where out_s is what sender s outputs in this very forward (observed through its gate, which is left
open) and fill_s the method's fill (methods.py, through the gate's `fill`). An output edge moves the
final norm's output by the same change through that norm. Everything else runs as it is.

With one edge removed, out_s is its clean value (nothing before it moved), so the forward is path
patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the sender's effect only through that
receiver input, every other path at its clean value. With every edge but a circuit's removed, each
sender's own output is the circuit's (ACDC's semantics, Conmy et al. 2023), so the same forward also
evaluates a circuit. K replicas of a batch run in one forward, replica k with its own removed set;
a random fill's draws are averaged per example. Paths through MLPs are not edges: an MLP reads the
stream as it is in the forward (with one edge removed, its clean value).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..adapters import hooks
from ..objectives import call_model, logits_of, score
from ..ablation.prefix import repeat_batch
from ..ablation.sweep import Clean, Sweep
from .edges import OUTPUT, Edge
from .wiring import Wiring

PER_FORWARD = 8  # replicas (removed sets) per forward
SENDERS = 8  # senders whose changes are summed at a time inside a hook


@dataclass
class Outcome:
    """Per-example sums of K removed sets on one batch: loss_sum [K, B], correct [K, B]; diff_sum [K, B] the
    logit difference label - wrong answer, where the data names wrong answers (else None)."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    diff_sum: torch.Tensor | None = None


class Patcher:
    """The edges of `sweep`'s sites under its gates (their fills set by the method), wired by `wiring`."""

    def __init__(self, sweep: Sweep, wiring: Wiring, edges: Sequence[Edge]):
        self.sweep, self.wiring, self.edges = sweep, wiring, list(edges)
        index = {e: i for i, e in enumerate(self.edges)}
        starts, n = [], 0
        for site in sweep.sites:
            starts.append(n)
            n += site.n_heads
        self.starts, self.n_senders = starts, n  # global sender index of site s's head 0
        self.senders = [(s, h) for s, site in enumerate(sweep.sites) for h in range(site.n_heads)]
        missing = len(self.edges)  # an edge not in the list is never removed: its index points past the end
        # per receiver site and input: [senders before it, J] edge index of (sender, slice j)
        self.receive = [[torch.tensor([[index.get(Edge(self.senders[g], (r, h), p), missing)
                                        for (p, h) in inp.slices] for g in range(starts[r])], dtype=torch.long)
                         for inp in site.inputs] for r, site in enumerate(wiring.sites)]
        self.output = torch.tensor([index.get(Edge(sh, None, OUTPUT), missing) for sh in self.senders])
        self.forwards = 0

    def clean(self, inputs: Any, labels: Any, rows: torch.Tensor | None) -> tuple[Clean, dict[int, torch.Tensor]]:
        """The clean pass of a batch and each frozen norm's clean input (by id, [B, T, d])."""
        normed: dict[int, list[torch.Tensor]] = {id(n): [] for n in self.wiring.norms}

        def record(norm):
            return lambda: norm.register_forward_pre_hook(lambda _m, args: normed[id(norm)].append(args[0].detach()))

        with hooks(*map(record, self.wiring.norms)):
            clean = self.sweep.clean(inputs, labels, grad=False, record=False, rows=rows)
        bad = {len(v) for v in normed.values()} - {1}
        assert not bad, f"a frozen norm ran {sorted(bad)} times in one forward"
        return clean, {k: v[0] for k, v in normed.items()}

    def removed(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor) -> Outcome:
        """Outcomes of removing each row of `sets` [K, E] (bool over self.edges), K per forward."""
        parts = [self._draws(clean, normed, sets[i:i + PER_FORWARD]) for i in range(0, len(sets), PER_FORWARD)]
        diff = None if parts[0].diff_sum is None else torch.cat([p.diff_sum for p in parts])
        return Outcome(torch.cat([p.loss_sum for p in parts]), torch.cat([p.correct for p in parts]), diff)

    def _draws(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor) -> Outcome:
        outs = [self._forward(clean, normed, sets, draw) for draw in range(self.sweep.draws)]
        if len(outs) == 1:
            return outs[0]
        mean = lambda key: torch.stack([getattr(o, key).double() for o in outs]).mean(0)  # noqa: E731
        return Outcome(mean("loss_sum"), mean("correct"), None if outs[0].diff_sum is None else mean("diff_sum"))

    def _forward(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor, draw: int) -> Outcome:
        K, B = len(sets), clean.batch
        mask = torch.cat([sets.float(), sets.new_zeros(K, 1).float()], dim=1)  # the last column: "no such edge"
        rows = None if clean.rows is None else clean.rows.repeat(K)
        writes: dict[int, torch.Tensor] = {}  # site -> [K * B, T, H, D]: each head's output minus its fill
        with self._observing(writes, rows, draw), hooks(*self._moves(writes, normed, mask, K, B)), torch.no_grad():
            logits = logits_of(call_model(self.sweep.model, repeat_batch(clean.inputs, K, B)))
        self.forwards += 1
        self.sweep.count_forward(K * B)
        wrong = None if clean.wrong is None else repeat_batch(clean.wrong, K, B)
        sc = score(logits.reshape(K * B, *logits.shape[1:]), repeat_batch(clean.targets, K, B), wrong)
        return Outcome(sc.loss_sum.view(K, B), sc.correct.view(K, B), None if wrong is None else sc.diff_sum.view(K, B))

    @contextmanager
    def _observing(self, writes: dict[int, torch.Tensor], rows, draw: int) -> Iterator[None]:
        def observer(s: int):
            gate = self.sweep.gates[s]

            def observe(head_out: torch.Tensor) -> None:  # [K * B, T, H, D]
                fill = None if gate.fill is None else gate.fill(head_out, rows, draw)
                removed = head_out if fill is None else head_out - fill.to(head_out.device, head_out.dtype)
                writes[s] = removed.detach()  # [K * B, T, H, D]: each head's write is made when a hook needs it
            return observe

        try:
            for s, gate in enumerate(self.sweep.gates):
                gate.observer = observer(s)
            yield
        finally:
            for gate in self.sweep.gates:
                gate.observer = None

    def _moves(self, writes, normed, mask: torch.Tensor, K: int, B: int) -> list:
        """The hook registrations moving each receiver input, and the final norm's output, by its removed edges."""
        regs = []
        for r, site in enumerate(self.wiring.sites):
            for i, inp in enumerate(site.inputs):
                m = mask[:, self.receive[r][i]]  # [K, n, J]
                if r and bool(m.any()):
                    regs.append(self._receiver_hook(inp, site.norm, r, writes, normed, m, K, B))
        m = mask[:, self.output]  # [K, n]
        if bool(m.any()):
            regs.append(self._output_hook(writes, normed, m, K, B))
        return regs

    def _removed(self, norm, m: torch.Tensor, writes, normed, K: int, w: torch.Tensor | None) -> torch.Tensor:
        """Sum over the senders removed in some replica of their change through `norm` (frozen), masked per
        replica by m ([K, n, F] with w [d, F]: a receiver's projection features; [K, n]: the final norm's
        output) -> [K * B, T, F or d]. SENDERS at a time, so memory does not grow with the senders."""
        active = (m.flatten(2).any(2) if m.dim() == 3 else m).any(0).nonzero().flatten().tolist()
        form = None if norm is None else self.wiring.form_of(norm)
        total = None
        for i in range(0, len(active), SENDERS):
            g = active[i:i + SENDERS]
            delta = -torch.stack([self._write(writes, j) for j in g], dim=2)  # [K * B, T, c, d]
            if form is not None:
                x = normed[id(norm)]
                x = x.repeat(K, *([1] * (x.dim() - 1)))[:, :, None, :].to(delta.device)  # [K * B, T, 1, d]
                delta = form.change(norm, x, delta)
            delta = delta.reshape(K, -1, *delta.shape[1:])  # [K, B, T, c, d]
            mk = m[:, g].to(delta.device, delta.dtype)
            part = (torch.einsum("kbtcd,df,kcf->kbtf", delta, w.to(delta.device, delta.dtype), mk) if w is not None
                    else torch.einsum("kbtcd,kc->kbtd", delta, mk))
            total = part if total is None else total + part
        return total.reshape(-1, *total.shape[2:])

    def _write(self, writes, j: int) -> torch.Tensor:
        """Sender j's write minus its fill's, W_O[h] (out - fill), in this forward.  # [K * B, T, d]"""
        s, h = self.senders[j]
        removed = writes[s][:, :, h].float()  # [K * B, T, D]
        return removed @ self.wiring.sites[s].write[h].to(removed.device).float()

    def _receiver_hook(self, inp, norm, r: int, writes, normed, m: torch.Tensor, K: int, B: int):
        mask = m.repeat_interleave(self.wiring.head_dim[r], dim=-1)  # [K, n, F]

        def move(_module, _args, out):
            return out + self._removed(norm, mask, writes, normed, K, inp.weight).to(out.dtype)
        return lambda: inp.module.register_forward_hook(move)

    def _output_hook(self, writes, normed, m: torch.Tensor, K: int, B: int):
        final = self.wiring.final

        def move(_module, _args, out):
            return out + self._removed(final, m, writes, normed, K, None).to(out.dtype)
        return lambda: final.register_forward_hook(move)


@dataclass
class Measured:
    """Per-example sums over the data: clean loss_sum, correct, count [N]; per removed set [N, M]. Where the
    data names wrong answers: the clean logit difference diff [N] over diff_count [N] units, per set set_diff
    [N, M] (else None)."""

    loss_sum: Any
    correct: Any
    count: Any
    set_loss: Any
    set_correct: Any
    diff: Any = None
    diff_count: Any = None
    set_diff: Any = None


def over_data(patcher: Patcher, batches: Sequence[tuple[Any, Any]], sets: torch.Tensor) -> Measured:
    """Each removed set of `sets` [M, E] on every batch (one clean pass per batch, then K sets per forward)."""
    import numpy as np

    from ..ablation.steps import indexed

    parts: list[tuple] = []
    diffs: list[tuple] = []
    for inputs, labels, rows in indexed(batches, 0):
        clean, normed = patcher.clean(inputs, labels, rows)
        out = patcher.removed(clean, normed, sets) if len(sets) else None
        B = clean.batch
        parts.append((clean.loss_sum.double().cpu().numpy(), clean.correct.double().cpu().numpy(),
                      clean.count.double().cpu().numpy(),
                      np.zeros((B, 0)) if out is None else out.loss_sum.double().cpu().numpy().T,
                      np.zeros((B, 0)) if out is None else out.correct.double().cpu().numpy().T))
        if clean.diff_sum is not None:
            diffs.append((clean.diff_sum.double().cpu().numpy(), clean.diff_count.double().cpu().numpy(),
                          np.zeros((B, 0)) if out is None else out.diff_sum.double().cpu().numpy().T))
    joined = [np.concatenate([p[i] for p in parts]) for i in range(5)]
    if diffs:
        joined += [np.concatenate([p[i] for p in diffs]) for i in range(3)]
    return Measured(*joined)
