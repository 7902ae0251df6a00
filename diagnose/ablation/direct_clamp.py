"""Direct effects by clamping, for models whose path a traced forward found (adapters/_stream.py).

Per batch, one clean pass records every sublayer's output and every norm's input and output. Then K
heads of one site per forward (the batch replicated K times, replica k closing head k through its gate,
with the method's fill, as the sweep does):

    sublayer(x)  -> its clean output                       # every later attention and MLP: frozen
    norm(x)      -> norm(x_clean) + change(x_clean, x - x_clean)   # its scale frozen (norms.NormForm)

so the head's change reaches the output through the residual stream and the norms only, the norms
linear in it, as the declared paths of direct.py measure it; the modules that carry the head's write
to the stream, and the output layers after the stack, run as they are. A sublayer or norm before the
site sees its clean input and gives its clean output either way.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn as nn

from .._distributed import Ranks
from ..adapters import StreamPlan, hooks
from ..errors import DiagnoseError
from ..objectives import batch_size_of, call_model, logits_of, score
from .accumulate import Accumulator
from .gate import close_heads
from .prefix import repeat_batch, take_rows
from .shards import merge
from .steps import indexed
from .sweep import Ablated, Clean, Sweep, _kl_sums


class Passes:
    """The loop both direct-effect passes share (declared path: direct.Direct; traced: Clamped): per batch
    the clean pass, then every head's direct-path outcome (each subclass's `_pass(inputs, labels, rows, heads)
    -> (Clean, Ablated)`), summed over this rank's parts and merged."""

    sweep: Sweep
    seconds: float
    tick = None  # called after each site's chunk of heads (the progress), set by run

    def steps(self, n_parts: int, heads: Sequence[int]) -> int:
        """The ticks `run` makes: one per chunk of heads of one site, on each part."""
        return n_parts * sum(1 for _ in self._site_chunks(heads))

    def run(self, parts: Sequence[tuple[Any, Any]], first: int, r: Ranks, heads: Sequence[int],
            tick=None) -> Accumulator:
        """Every head of `heads` (global indices) on this rank's parts; all ranks' sums; tick() per chunk."""
        acc = Accumulator(len(self.sweep.heads))
        started = time.perf_counter()
        self.tick = tick

        def work() -> None:
            for inputs, labels, rows in indexed(parts, first):
                clean, ablated = self._pass(inputs, labels, rows, heads)
                acc.add_clean(clean)
                acc.add_ablated(ablated)

        r.run_local("measuring direct effects", work)
        self.seconds += time.perf_counter() - started
        return merge(acc, r)

    def _site_chunks(self, heads: Sequence[int]) -> Iterator[tuple[int, list[int]]]:
        """(site, up to `replication` of its heads) for every head of `heads`, site by site."""
        by_site: dict[int, list[int]] = {}
        for m in heads:
            by_site.setdefault(self.sweep.heads[m][0], []).append(m)
        k = self.sweep.replication
        for s, ms in by_site.items():
            for i in range(0, len(ms), k):
                yield s, ms[i:i + k]


class Clamped(Passes):
    """The clamped direct-effect passes of one sweep; `run` returns an Accumulator as Direct.run does."""

    def __init__(self, sweep: Sweep, plan: StreamPlan):
        self.sweep, self.plan = sweep, plan
        self.replay_ok = False  # every block recomputes: its sublayers are clamped, not replayed
        self.forwards = 0
        self.seconds = 0.0

    def _pass(self, inputs: Any, labels: Any, rows: torch.Tensor, heads: Sequence[int]) -> tuple[Clean, Ablated]:
        clean, record = self._clean(inputs, labels, rows)
        return clean, self._batch(clean, record, heads)

    def _clean(self, inputs: Any, labels: Any, rows: torch.Tensor) -> tuple[Clean, dict[str, list]]:
        """The clean pass, recording each sublayer's output and each norm's (input, output)."""
        record: dict[str, list] = {"sublayers": [[] for _ in self.plan.sublayers],
                                   "norms": [[] for _ in self.plan.norms]}

        def keep(kind: str, i: int, m: nn.Module):
            def hook(_m, args, out):
                record[kind][i].append(_detach(out) if kind == "sublayers" else (args[0].detach(), out.detach()))
            return lambda: m.register_forward_hook(hook)

        regs = [keep("sublayers", i, m) for i, m in enumerate(self.plan.sublayers)]
        regs += [keep("norms", i, m) for i, m in enumerate(self.plan.norms)]
        with hooks(*regs):
            clean = self.sweep.clean(inputs, labels, grad=False, record=False, rows=rows)
        runs = {len(v) for kind in record.values() for v in kind}
        if runs - {1}:
            raise DiagnoseError(f"a sublayer or norm on a head's path ran {sorted(runs)} times in one forward of the "
                                "data, not once as in the traced forward, so its clean value is ambiguous; pass "
                                "--no-direct (direct=False)")
        return clean, {kind: [v[0] for v in values] for kind, values in record.items()}

    def _batch(self, clean: Clean, record: dict, heads: Sequence[int]) -> dict[int, Ablated]:
        out: dict[int, Ablated] = {}
        for s, ms in self._site_chunks(heads):
            out.update(self._chunk(clean, record, s, ms))
            if self.tick:
                self.tick()
        return out

    def _chunk(self, clean: Clean, record: dict, s: int, ms: list[int]) -> dict[int, Ablated]:
        """Heads ms of site s, one forward of K = len(ms) replicas per draw of the method's fill."""
        K, B = len(ms), clean.batch
        outcomes = []
        for draw in range(self.sweep.draws):
            logits = self._forward(clean, record, s, ms, draw)  # [K * B, ...]
            sc = score(logits, repeat_batch(clean.targets, K, B))
            outcomes.append((sc.loss_sum.view(K, B), sc.correct.view(K, B),
                             _kl_sums(clean, logits.reshape(K, B, *logits.shape[1:]))))
        loss_sum, correct, kl = (outcomes[0] if len(outcomes) == 1 else
                                 (torch.stack([o[i].double() for o in outcomes]).mean(0) for i in range(3)))
        return {m: Ablated(loss_sum[j], correct[j], float(kl[j])) for j, m in enumerate(ms)}

    def _forward(self, clean: Clean, record: dict, s: int, ms: list[int], draw: int) -> torch.Tensor:
        """K replicas of the batch, replica k closing head ms[k], every other sublayer clamped, every norm frozen."""
        sweep = self.sweep
        return self._run(clean, [sweep.heads[m] for m in ms], sweep.closed, record, s, draw)

    def verify(self, inputs: Any, labels: Any) -> str | None:
        """On the batch's first example: closing all of a site's heads must move the output on the clamped path
        wherever it moves it without clamps, else a clamped sublayer carries the stream itself (a module that
        adds the residual inside, as Bloom's attention and MLP do) and would undo every head. The reason, or None."""
        try:
            return self._verify(inputs, labels)
        except Exception as e:  # noqa: BLE001 - said in the one line the result carries, not dropped
            return (f"the clamped forward on the path traced through {self.plan.stack} failed ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}), so direct effects are not measured; an adapter "
                    "for the model can declare the path (residual_path, diagnose/adapters/readout.py)")

    def _verify(self, inputs: Any, labels: Any) -> str | None:
        B = batch_size_of(inputs)
        one, lab = take_rows(inputs, 0, 1, B), None if labels is None else take_rows(labels, 0, 1, B)
        clean, record = self._clean(one, lab, None)
        for s, site in enumerate(self.sweep.sites):
            closed = [*self.sweep.closed, *((s, h) for h in range(site.n_heads))]
            plain = self._run(clean, [None], closed, None, s, 0)
            if not torch.equal(plain, clean.logits) and torch.equal(self._run(clean, [None], closed, record, s, 0),
                                                                    clean.logits):
                return (f"closing every head of {site.name} moves the output, but not on the path traced through "
                        f"{self.plan.stack}: a module held at its clean output there carries the residual stream "
                        "itself (it adds the residual inside), so direct effects are not measured; an adapter for "
                        "the model can declare the path (residual_path, diagnose/adapters/readout.py)")
        return None

    def _run(self, clean: Clean, replicas: list, closed: list, record: dict | None, s: int, draw: int) -> torch.Tensor:
        """K = len(replicas) replicas of the batch, replica k closing replicas[k] (a (site, head) or None) on top
        of `closed`; with `record`, site s's sublayers clamped and every norm frozen.  # [K * B, ...]"""
        sweep, K, B = self.sweep, len(replicas), clean.batch
        scales = close_heads(sweep.n_heads, closed, B, replicas, device=clean.targets.device)
        rows = None if clean.rows is None else repeat_batch(clean.rows, K, B)  # [K * B]

        def clamp(i: int):
            out = record["sublayers"][i]
            return lambda: self.plan.sublayers[i].register_forward_hook(lambda _m, _a, live: _like(out, live, K))

        def freeze(i: int):
            norm, form = self.plan.norms[i], self.plan.forms[i]
            x_clean, y_clean = record["norms"][i]

            def hook(_m, args, live):
                x0, y0 = _like(x_clean, args[0], K), _like(y_clean, live, K)
                return (y0.float() + form.change(norm, x0, args[0].float() - x0.float())).to(live.dtype)
            return lambda: norm.register_forward_hook(hook)

        regs = [] if record is None else [clamp(i) for i in self.plan.clamp[s]] + \
            [freeze(i) for i in range(len(self.plan.norms))]
        try:
            for gate, scale in zip(sweep.gates, scales):
                gate.scale, gate.rows, gate.draw = scale, rows, draw
            with torch.no_grad(), hooks(*regs), sweep.scoring(clean.index):
                logits = logits_of(call_model(sweep.model, repeat_batch(clean.inputs, K, B)))
        finally:
            for gate in sweep.gates:
                gate.scale = gate.rows = None
        self.forwards += 1
        return logits


def _like(clean: Any, live: Any, k: int) -> Any:
    """The clean value in the shape of the live one: repeated k times along the dim that holds the
    replicas (the batch dim, wherever the model keeps it), a fresh tensor in any case."""
    if isinstance(clean, torch.Tensor) and isinstance(live, torch.Tensor):
        if clean.shape == live.shape:
            return clean.clone().to(live.dtype)
        for d in range(clean.dim()):
            if live.shape[d] == k * clean.shape[d] and live.shape[:d] + live.shape[d + 1:] == \
                    clean.shape[:d] + clean.shape[d + 1:]:
                return clean.repeat(*[k if j == d else 1 for j in range(clean.dim())]).to(live.dtype)
        raise DiagnoseError(f"a clamped sublayer gave {tuple(live.shape)} where its clean output was "
                            f"{tuple(clean.shape)} for {k} replicas; pass --no-direct (direct=False)")
    if isinstance(clean, Mapping) and isinstance(live, Mapping):  # a ModelOutput: item and attribute
        for key in live.keys():
            if key in clean:
                live[key] = _like(clean[key], live[key], k)
        return live
    if isinstance(clean, (tuple, list)) and isinstance(live, (tuple, list)) and len(clean) == len(live):
        return type(live)(_like(c, l, k) for c, l in zip(clean, live)) if isinstance(live, list) or \
            not hasattr(live, "_fields") else type(live)(*(_like(c, l, k) for c, l in zip(clean, live)))
    return live


def _detach(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, (tuple, list)):
        return type(obj)(_detach(v) for v in obj) if not hasattr(obj, "_fields") else \
            type(obj)(*(_detach(v) for v in obj))
    return obj
