"""Path patching through the head gate: a forward in which chosen edges carry the sender's ablated value.

An edge s -> (r, p, h) is removed by moving receiver r's projection output block (p, h) by

    W_in[p, h] . norm_r.change(-(W_O[s] (out_s - fill_s)))      # [B, T, D], norm_r's scale frozen clean

where out_s is what sender s outputs in this very forward (observed through its gate, which is left
open) and fill_s the method's fill (methods.py, through the gate's `fill`). An output edge moves the
final norm's output by the same change through that norm. Everything else runs as it is, but for the
norm a replica moves, whose own output there is made with its clean scale too (the norm frozen, not
only the change): with one edge removed its input is the clean one, so nothing changes; with a circuit's
edges removed, a removed sender's output, in the stream and taken off again, then cancels exactly
(at the norm's own scale in that forward, (1 / sigma - 1 / sigma_clean) of it would stay in, a leak that
large MLP writes make large).

With one edge removed, out_s is its clean value (nothing before it moved), so the forward is path
patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the sender's effect only through that
receiver input, every other path at its clean value. With every edge but a circuit's removed, each
sender's own output is the circuit's (ACDC's semantics, Conmy et al. 2023), so the same forward also
evaluates a circuit. K replicas of a batch run in one forward, replica k with its own removed set;
a random fill's draws are averaged per example. Where the MLPs are nodes (mlp.py), an edge into an MLP
moves its input the same way, through its own norm, and an MLP sends its output minus its fill (no W_O);
where they are not, paths through MLPs are not edges: an MLP reads the stream as it is in the forward.

Reuse (as the head sweep's prefix.py): nothing before the earliest receiver a forward moves can change,
so the blocks that finish before that receiver's layer starts replay their clean output, and the senders
in them write what they wrote in the clean pass (recorded there). The removed sets are run ordered by
their earliest receiver and first sender, so the replicas of one forward share both: the prefix replayed
is as long as it can be, and a receiver's hook makes few senders' writes. Replay is checked once per
layer (a clean replica with replay gives the clean logits) and turned off where it does not hold.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..adapters import hooks
from .._tolerance import close, model_size
from ..objectives import call_model, logits_of, score
from ..ablation.prefix import replay, repeat_batch, take_rows
from ..ablation.sweep import Clean, Sweep
from .edges import MLP, OUTPUT, Edge, senders
from .mixing import SENDERS, summed, through
from .wiring import Wiring

PER_FORWARD = 8  # replicas (removed sets) per forward, unless the caller plans them (api.py: the sweep's plan)
MIX_ABOVE = 2  # more (replica, sender, block) triples per replica than this: _mixed, else one product each


@dataclass
class Outcome:
    """Per-example sums of K removed sets on one batch: loss_sum [K, B], correct [K, B]; diff_sum [K, B] the
    logit difference label - wrong answer, where the data names wrong answers (else None)."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    diff_sum: torch.Tensor | None = None


class Patcher:
    """The edges of `sweep`'s sites under its gates (their fills set by the method), wired by `wiring`; with
    `mlp_gates` (mlp.mlp_gated, one per wiring.mlps) the MLPs are nodes too."""

    tick = None  # called after each forward of removed sets (the progress; api.find_circuit sets it)
    _sums: dict = {}  # reset per forward (_forward)

    def __init__(self, sweep: Sweep, wiring: Wiring, edges: Sequence[Edge], per_forward: int = PER_FORWARD,
                 mlp_gates: Sequence[Any] = ()):
        self.sweep, self.wiring, self.edges = sweep, wiring, list(edges)
        self.per_forward = per_forward  # removed sets (replicas) per forward: the head sweep's plan on a CPU
        assert len(mlp_gates) in (0, len(wiring.mlps)), "one gate per MLP node, or none"
        self.mlps = list(wiring.mlps) if mlp_gates else []
        n_sites = len(sweep.sites)
        self.gates = [*sweep.gates, *mlp_gates]  # every node's gate: the sites', then the MLPs'
        self.modules = [site.module for site in sweep.sites] + [m.site.module for m in self.mlps]
        self.write_of = [site.write for site in wiring.sites] + [None] * len(self.mlps)  # None: the MLP's output
        # global sender order (edges.senders): each layer's heads, then its MLP; per sender (gate, head)
        self.nodes = senders(sweep.sites, [m.site.layer for m in self.mlps])
        mlp_gate = {m.site.layer: n_sites + i for i, m in enumerate(self.mlps)}
        self.source = [(mlp_gate[layer], 0) if h is None else (layer, h) for layer, h in self.nodes]
        self.order = list(dict.fromkeys(g for g, _ in self.source))  # the gates in sender order
        self.n_senders = len(self.nodes)
        self.before = [sum(1 for n in self.nodes if n[0] < r) for r in range(n_sites)]  # senders before site r
        self.before_mlp = [sum(1 for n in self.nodes if n[0] < m.site.layer or (n[0] == m.site.layer and n[1]
                                                                                 is not None)) for m in self.mlps]
        index = {e: i for i, e in enumerate(self.edges)}
        missing = len(self.edges)  # an edge not in the list is never removed: its index points past the end
        # per receiver site and input: [senders before it, J] edge index of (sender, slice j)
        self.receive = [[torch.tensor([[index.get(Edge(self.nodes[g], (r, h), p), missing)
                                        for (p, h) in inp.slices] for g in range(self.before[r])],
                                      dtype=torch.long).reshape(self.before[r], len(inp.slices))
                         for inp in site.inputs] for r, site in enumerate(wiring.sites)]
        self.receive_mlp = [torch.tensor([index.get(Edge(self.nodes[g], (m.site.layer, None), MLP), missing)
                                          for g in range(n)], dtype=torch.long)
                            for m, n in zip(self.mlps, self.before_mlp)]  # per MLP node: [senders before it]
        self.output = torch.tensor([index.get(Edge(n, None, OUTPUT), missing) for n in self.nodes])
        # per edge: the layer whose input it moves (n_sites: the output) and its sender's global index
        where = {n: j for j, n in enumerate(self.nodes)}
        self.moves = torch.tensor([n_sites if e.receiver is None else e.receiver[0] for e in self.edges] + [n_sites])
        self.sender_of = torch.tensor([where[e.sender] for e in self.edges] + [self.n_senders])
        self.forwards = 0
        self.replaying = sweep.reuse  # off once a replayed prefix fails to reproduce the clean logits
        self.checked: set[int] = set()
        self._heads: tuple[int, dict[int, torch.Tensor]] | None = None  # (id of the clean pass, gate -> out)

    def clean(self, inputs: Any, labels: Any, rows: torch.Tensor | None) -> tuple[Clean, dict[int, torch.Tensor]]:
        """The clean pass of a batch and each frozen norm's clean input (by id, [B, T, d])."""
        normed: dict[int, list[torch.Tensor]] = {id(n): [] for n in self.wiring.norms}

        def record(norm):
            return lambda: norm.register_forward_pre_hook(lambda _m, args: normed[id(norm)].append(args[0].detach()))

        heads: dict[int, torch.Tensor] = {}  # gate -> its heads' (an MLP's) clean output [B, T, H, D]
        try:
            for s, gate in enumerate(self.gates):
                gate.observer = lambda out, s=s: heads.setdefault(s, out.detach())
            with hooks(*map(record, self.wiring.norms)):
                clean = self.sweep.clean(inputs, labels, grad=False, record=self.replaying, rows=rows)
        finally:
            for gate in self.gates:
                gate.observer = None
        bad = {len(v) for v in normed.values()} - {1}
        assert not bad, f"a frozen norm ran {sorted(bad)} times in one forward"
        self._heads = (id(clean), heads)
        return clean, {k: v[0] for k, v in normed.items()}

    def removed(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor) -> Outcome:
        """Outcomes of removing each row of `sets` [K, E] (bool over self.edges), K per forward, the rows run
        in the order of their earliest receiver and first sender (module docstring)."""
        wide = torch.cat([sets, sets.new_zeros(len(sets), 1)], dim=1)  # [M, E + 1]
        first = torch.where(wide, self.moves, len(self.sweep.sites)).min(1).values  # [M]
        sender = torch.where(wide, self.sender_of, self.n_senders).min(1).values
        order = torch.argsort(first * (self.n_senders + 1) + sender, stable=True)
        K = self.per_forward
        parts = []
        for i in range(0, len(sets), K):
            parts.append(self._draws(clean, normed, sets[order[i:i + K]], int(first[order[i:i + K]].min())))
            if self.tick:
                self.tick()
        back = torch.argsort(order)
        diff = None if parts[0].diff_sum is None else torch.cat([p.diff_sum for p in parts])[back]
        return Outcome(torch.cat([p.loss_sum for p in parts])[back], torch.cat([p.correct for p in parts])[back], diff)

    def _draws(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor, first: int) -> Outcome:
        blocks = self._replayed(clean, first)
        outs = [self._forward(clean, normed, sets, draw, blocks) for draw in range(self.sweep.draws)]
        if len(outs) == 1:
            return outs[0]
        mean = lambda key: torch.stack([getattr(o, key).double() for o in outs]).mean(0)  # noqa: E731
        return Outcome(mean("loss_sum"), mean("correct"), None if outs[0].diff_sum is None else mean("diff_sum"))

    def _replayed(self, clean: Clean, first: int) -> list[int]:
        """The blocks that may replay when the earliest input moved is site `first`'s (n_sites: the output,
        whose last layer then runs), checked once per site on the batch's first example."""
        recorder, site = self.sweep.recorder, min(first, len(self.sweep.sites) - 1)
        if not self.replaying or recorder is None or clean.recorded is None:
            return []
        blocks = recorder.reusable(site)
        if blocks and site not in self.checked:
            self.checked.add(site)
            one = {i: take_rows(clean.recorded[i], 0, 1, clean.batch) for i in blocks}
            with replay(recorder, one, blocks, 1, 1), torch.no_grad():
                logits = logits_of(call_model(self.sweep.model, take_rows(clean.inputs, 0, 1, clean.batch)))
            depth, width = model_size(self.sweep.sites)
            if not close(logits.float(), clean.logits[:1].float(), depth=depth, width=width)[0]:
                self.replaying, blocks = False, []  # a block with side effects: run every forward in full
        return blocks

    def _inside(self, blocks: list[int]) -> list[int]:
        """The gates whose attention module (MLP) sits in one of the replayed `blocks`."""
        held = {id(m) for i in blocks for m in self.sweep.recorder.blocks[i].modules()}
        return [g for g, module in enumerate(self.modules) if id(module) in held]

    def _forward(self, clean: Clean, normed: dict[int, torch.Tensor], sets: torch.Tensor, draw: int,
                 blocks: list[int]) -> Outcome:
        K, B = len(sets), clean.batch
        mask = torch.cat([sets.float(), sets.new_zeros(K, 1).float()], dim=1)  # the last column: "no such edge"
        rows = None if clean.rows is None else clean.rows.repeat(K)
        writes: dict[int, torch.Tensor] = {}  # gate -> [K * B, T, H, D]: each head's (MLP's) output minus its fill
        self._sums = {}  # this forward's sums of the senders' writes (mixing.prefix)
        moves = self._frozen(normed, mask, K, B) + self._moves(writes, normed, mask, K, B)
        with self._observing(writes, rows, draw) as observe, hooks(*moves), \
                torch.no_grad(), replay(self.sweep.recorder, clean.recorded, blocks, K, B) if blocks else nullcontext():
            if blocks:
                assert self._heads is not None and self._heads[0] == id(clean), "removed() on a batch not cleaned"
                for g in self._inside(blocks):  # their gates do not run: the senders' clean writes
                    observe[g](repeat_batch(self._heads[1][g], K, B))
            logits = logits_of(call_model(self.sweep.model, repeat_batch(clean.inputs, K, B)))
        self.forwards += 1
        self.sweep.count_forward(K * B)
        wrong = None if clean.wrong is None else repeat_batch(clean.wrong, K, B)
        sc = score(logits.reshape(K * B, *logits.shape[1:]), repeat_batch(clean.targets, K, B), wrong)
        return Outcome(sc.loss_sum.view(K, B), sc.correct.view(K, B), None if wrong is None else sc.diff_sum.view(K, B))

    @contextmanager
    def _observing(self, writes: dict[int, torch.Tensor], rows, draw: int) -> Iterator[list]:
        def observer(s: int):
            gate = self.gates[s]

            def observe(head_out: torch.Tensor) -> None:  # [K * B, T, H, D]
                fill = None if gate.fill is None else gate.fill(head_out, rows, draw)
                removed = head_out if fill is None else head_out - fill.to(head_out.device, head_out.dtype)
                writes[s] = removed.detach()  # [K * B, T, H, D]: each head's write is made when a hook needs it
            return observe

        observers = [observer(s) for s in range(len(self.gates))]
        try:
            for gate, fn in zip(self.gates, observers):
                gate.observer = fn
            yield observers
        finally:
            for gate in self.gates:
                gate.observer = None

    def _frozen(self, normed, mask: torch.Tensor, K: int, B: int) -> list:
        """The hook registrations making each moved norm's output with its clean scale in the replicas that move
        it: out + change(clean x, x) - change(x, x), the bias and the gain as they are."""
        moving: dict[int, torch.Tensor] = {}  # id(norm) -> [K] whether replica k moves an input behind it
        for site, receive in zip(self.wiring.sites, self.receive):
            for rec in receive if site.norm is not None else ():
                moving[id(site.norm)] = moving.get(id(site.norm), 0) + mask[:, rec].flatten(1).sum(1)
        for mlp, rec in zip(self.mlps, self.receive_mlp):
            moving[id(mlp.norm)] = moving.get(id(mlp.norm), 0) + mask[:, rec].sum(1)
        moving[id(self.wiring.final)] = moving.get(id(self.wiring.final), 0) + mask[:, self.output].sum(1)
        regs = []
        for norm in self.wiring.norms:
            rows = moving.get(id(norm))
            if rows is not None and bool((rows > 0).any()):
                regs.append(self._freeze(norm, normed, (rows > 0).repeat_interleave(B), K))
        return regs

    def _freeze(self, norm, normed, rows: torch.Tensor, K: int):
        form = self.wiring.form_of(norm)

        def freeze(_module, args, out):  # rows [K * B]: the replicas' rows whose norm is frozen
            x = args[0]
            clean = normed[id(norm)].repeat(K, *([1] * (x.dim() - 1))).to(x.device)  # [K * B, T, d]
            fix = form.change(norm, clean, x) - form.change(norm, x, x)
            return out + (fix * rows.to(x.device)[:, None, None]).to(out.dtype)
        return lambda: norm.register_forward_hook(freeze)

    def _moves(self, writes, normed, mask: torch.Tensor, K: int, B: int) -> list:
        """The hook registrations moving each receiver input, and the final norm's output, by its removed edges."""
        regs = []
        for r, site in enumerate(self.wiring.sites):
            for i, inp in enumerate(site.inputs):
                m = mask[:, self.receive[r][i]]  # [K, n, J]
                if r and bool(m.any()):
                    regs.append(self._receiver_hook(inp, site.norm, r, writes, normed, m, K, B))
        for mlp, receive in zip(self.mlps, self.receive_mlp):
            m = mask[:, receive]  # [K, n]
            if len(receive) and bool(m.any()):
                regs.append(self._mlp_hook(mlp, writes, normed, m, K))
        m = mask[:, self.output]  # [K, n]
        if bool(m.any()):
            regs.append(self._output_hook(writes, normed, m, K, B))
        return regs

    def _removed(self, norm, m: torch.Tensor, writes, normed, K: int, w: torch.Tensor | None, D: int = 0
                 ) -> torch.Tensor:
        """Sum over the senders removed in some replica of their change through `norm` (frozen), masked per
        replica by m ([K, n, J] with w [d, J * D]: a receiver's projection feature blocks; [K, n]: the final
        norm's output) -> [K * B, T, J * D or d]. SENDERS at a time, so memory does not grow with the senders."""
        active = (m.any(2) if m.dim() == 3 else m).any(0).nonzero().flatten().tolist()
        form = None if norm is None else self.wiring.form_of(norm)
        if int(m.sum()) > MIX_ABOVE * K:  # many edges (a circuit): mix, then the norm and projection once
            return self._mixed(norm, form, m, writes, normed, K, w, D)
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
            part = (torch.einsum("kbtcd,kc->kbtd", delta, mk) if w is None
                    else through(delta, w.to(delta.device, delta.dtype), mk, D))
            total = part if total is None else total + part
        return total.reshape(-1, *total.shape[2:])

    def _mixed(self, norm, form, m: torch.Tensor, writes, normed, K: int, w: torch.Tensor | None, D: int
               ) -> torch.Tensor:
        """_removed for many (replica, sender, block) triples: the frozen norm and the projection are linear, so
        each replica's removed senders are summed per receiver block first (mixing.summed), and the norm's change and
        the projection applied once, not once per sender (on SmolLM2 a circuit's forward took minutes that
        way).  # [K * B, T, J * D or d]"""
        delta = -summed(lambda c: self._write(writes, c), m, K, self._sums)  # [K, B, T, (J,) d]
        if form is not None:
            x = normed[id(norm)]  # [B, T, d]: its clean scale, broadcast over the replicas (and blocks)
            x = x[None, :, :, None, :] if m.dim() == 3 else x[None]
            delta = form.change(norm, x.to(delta.device), delta)
        if w is None:
            return delta.reshape(-1, *delta.shape[2:])
        J = m.shape[2]
        out = torch.einsum("kbtjd,djD->kbtjD", delta, w.to(delta.device, delta.dtype).view(w.shape[0], J, D))
        return out.reshape(-1, out.shape[2], J * D)

    def _write(self, writes, j: int) -> torch.Tensor:
        """Sender j's write minus its fill's in this forward: W_O[h] (out - fill) of a head, out - fill of an
        MLP.  # [K * B, T, d]"""
        g, h = self.source[j]
        removed = writes[g][:, :, h].float()  # [K * B, T, D]
        w = self.write_of[g]
        return removed if w is None else removed @ w[h].to(removed.device).float()

    def _receiver_hook(self, inp, norm, r: int, writes, normed, m: torch.Tensor, K: int, B: int):
        D = self.wiring.head_dim[r]

        def move(_module, _args, out):
            return out + self._removed(norm, m, writes, normed, K, inp.weight, D).to(out.dtype)
        return lambda: inp.module.register_forward_hook(move)

    def _mlp_hook(self, mlp, writes, normed, m: torch.Tensor, K: int):
        def move(_module, args):
            x = args[0]
            return (x + self._removed(mlp.norm, m, writes, normed, K, None).to(x.dtype), *args[1:])
        return lambda: mlp.site.module.register_forward_pre_hook(move)

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


def over_data(patcher: Patcher, batches: Sequence[tuple[Any, Any]], sets: torch.Tensor, first: int = 0) -> Measured:
    """Each removed set of `sets` [M, E] on every batch (one clean pass per batch, then K sets per forward);
    first: the data set's index of the first batch's first example (a rank's shard, shards.py)."""
    import numpy as np

    from ..ablation.steps import indexed

    parts: list[tuple] = []
    diffs: list[tuple] = []
    for inputs, labels, rows in indexed(batches, first):
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
