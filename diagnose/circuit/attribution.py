"""Edge attribution: every edge's delta loss estimated from gradients, in a few forward and backward passes.

EAP (Syed et al. 2023): removing edge s -> (r, p, h) moves receiver r's projection output block (p, h) by
W_in . norm_r.change(delta_s) (patch.py), so to first order the loss moves by

    sum_{b, t} grad_out[r, p, h] . W_in . norm_r.change(delta_s) = sum_{b, t} u[r, p, h] . delta_s

with u = norm_r.change' (W_in^T grad_out), the frozen norm's adjoint (gain, 1 / sigma_clean, centring).
One backward gives every grad_out and the final norm's output gradient (the output edges); then each
pair of sites costs one einsum, and memory holds activations and the E scores, nothing per edge beyond.
An MLP node (mlp.py) receives at its input, u = norm_l.change'(grad_in), and sends its output minus its
fill (no W_O), so its edges are scored the same way.

EAP-IG (Hanna et al. 2024): the gradients averaged over STEPS points between the clean model and every
head removed by the method (each gate's scale 1 - alpha), the change delta_s still the clean one's.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..adapters import hooks
from ..objectives import call_model, logits_of, score, targets_for
from ..ablation.steps import indexed
from .patch import Patcher

ESTIMATORS = ("eap", "eap-ig")
STEPS = 5  # EAP-IG's integration points


def attribute(patcher: Patcher, batches: Sequence[tuple[Any, Any]], estimator: str = "eap", first: int = 0,
              reduce: Callable[[list, list], tuple[list, list]] | None = None) -> np.ndarray:
    """The estimated delta loss per unit of every edge of `patcher.edges` [E]. first: the data set's index of
    the first example of `batches`; reduce: the sums over the ranks (shards.py), None when alone."""
    scores = np.zeros(len(patcher.edges) + 1)  # the last slot: where "no such edge" indices land
    units = 0.0
    alphas = [0.0] if estimator == "eap" else [(k + 0.5) / STEPS for k in range(STEPS)]
    for inputs, labels, rows in indexed(batches, first):
        writes, normed, count, clean_grads = _pass(patcher, inputs, labels, rows, None)
        g = clean_grads if estimator == "eap" else _mean([_pass(patcher, inputs, labels, rows, a)[3] for a in alphas])
        _score(patcher, writes, normed, g, scores)
        units += count
        if patcher.tick:
            patcher.tick()
    if reduce is not None:
        (total,), (units,) = reduce([torch.from_numpy(scores)], [units])
        scores = total.numpy()
    return scores[:-1] / max(units, 1.0)


def _mean(grads: list[dict]) -> dict:
    return {k: sum(g[k] for g in grads) / len(grads) for k in grads[0]}


def _pass(patcher: Patcher, inputs, labels, rows, alpha: float | None):
    """One forward and backward: (writes {gate: -change [B, T, H, d]}, each frozen norm's input, units, grads);
    alpha None: the clean model, else every gate (heads and MLPs) at scale 1 - alpha."""
    sweep, wired = patcher.sweep, patcher.wiring
    outs: dict[Any, torch.Tensor] = {}
    normed: dict[int, torch.Tensor] = {}
    heads: dict[int, torch.Tensor] = {}

    def keep(key):
        def hook(_m, _a, out):
            outs[key] = out
        return hook

    def keep_input(key):
        def pre(_m, args):  # a copy the MLP alone reads, so that its gradient is the MLP's input's
            outs[key] = args[0].clone()
            return (outs[key], *args[1:])
        return pre

    regs = [lambda k=(r, i), m=inp.module: m.register_forward_hook(keep(k))
            for r, site in enumerate(wired.sites) for i, inp in enumerate(site.inputs)]
    regs += [lambda k=("mlp", i), m=mlp.site.module: m.register_forward_pre_hook(keep_input(k))
             for i, mlp in enumerate(patcher.mlps)]
    regs.append(lambda: wired.final.register_forward_hook(keep("final")))

    def record(norm):
        def pre(_m, args) -> None:  # returns None: a value returned would replace the norm's input
            normed.setdefault(id(norm), args[0].detach())
        return lambda: norm.register_forward_pre_hook(pre)

    regs += [record(n) for n in wired.norms]
    targets = targets_for(sweep.task, inputs, labels)
    try:
        for s, gate in enumerate(patcher.gates):
            gate.observer = lambda h, s=s: heads.setdefault(s, h.detach())
            if alpha is not None:
                gate.scale = torch.full((targets.shape[0], gate.site.n_heads), 1.0 - alpha)
                gate.rows = rows
        with torch.enable_grad(), hooks(*regs):
            logits = logits_of(call_model(sweep.model, inputs))
            sc = score(logits, targets.to(logits.device))
            keys = list(outs)
            grads = dict(zip(keys, torch.autograd.grad(sc.loss_sum.sum(), [outs[k] for k in keys], allow_unused=True)))
    finally:
        for gate in patcher.gates:
            gate.observer = gate.scale = gate.rows = None
    sweep.count_forward(targets.shape[0])
    grads = {k: (torch.zeros_like(outs[k]) if g is None else g.detach().float()) for k, g in grads.items()}
    writes = {}
    for s, gate in enumerate(patcher.gates):
        fill = None if gate.fill is None else gate.fill(heads[s], rows, 0)
        removed = (heads[s] if fill is None else heads[s] - fill.to(heads[s].device, heads[s].dtype)).float()
        w = patcher.write_of[s]  # None: an MLP, whose write is its output
        writes[s] = -(removed if w is None else torch.einsum("btsD,sDd->btsd", removed, w.float().to(removed.device)))
    return writes, normed, float(sc.count.sum()), grads


def _adjoint(patcher: Patcher, norm, normed, u: torch.Tensor) -> torch.Tensor:
    """The frozen norm's change map transposed, applied to u [B, T, J, d]."""
    if norm is None:
        return u
    form, x = patcher.wiring.form_of(norm), normed[id(norm)]
    g = form.gain(norm)
    v = u if g is None else u * g.to(u.device)
    if form.centred:
        v = v - v.mean(-1, keepdim=True)
    return v * form.scale(norm, x)[:, :, None, :].to(u.device)


def _score(patcher: Patcher, writes, normed, grads, scores: np.ndarray) -> None:
    """Add this batch's first-order delta loss of every edge to `scores` [E + 1]."""
    sites = patcher.wiring.sites
    # every sender's change, sender-major so that the senders before a receiver are one contiguous block
    every = torch.cat([writes[g].permute(2, 0, 1, 3) for g in patcher.order])  # [N, B, T, d]
    for r, site in enumerate(sites):
        if not r:
            continue
        for i, inp in enumerate(site.inputs):
            D = patcher.wiring.head_dim[r]
            g = grads[(r, i)]  # [B, T, F]
            u = torch.einsum("btjD,djD->btjd", g.reshape(*g.shape[:2], -1, D),
                             inp.weight.float().to(g.device).reshape(inp.weight.shape[0], -1, D))  # [B, T, J, d]
            s = _dot(every[:patcher.before[r]], _adjoint(patcher, site.norm, normed, u))  # [n, J]
            np.add.at(scores, patcher.receive[r][i].numpy(), s.double().cpu().numpy())
    # the MLPs' inputs and the final norm's output in one product over every sender (a receiver's later
    # senders are no edges of it: their scores are not read)
    us = [_adjoint(patcher, mlp.norm, normed, grads[("mlp", i)][:, :, None, :]) for i, mlp in enumerate(patcher.mlps)]
    us.append(_adjoint(patcher, patcher.wiring.final, normed, grads["final"][:, :, None, :]))
    s = _dot(every, torch.cat(us, dim=2)).double().cpu().numpy()  # [N, M + 1]
    for i, n in enumerate(patcher.before_mlp):
        np.add.at(scores, patcher.receive_mlp[i].numpy(), s[:n, i])
    np.add.at(scores, patcher.output.numpy(), s[:, -1])


def _dot(senders: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """sum over b, t, d of senders [n, B, T, d] times u [B, T, J, d] -> [n, J], as one matrix product."""
    J = u.shape[2]
    return senders.reshape(senders.shape[0], -1) @ u.to(senders.device).permute(0, 1, 3, 2).reshape(-1, J)


def spearman(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Rank correlation of two lists (None where fewer than 3 pairs or a list is constant)."""
    from scipy.stats import spearmanr

    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    rho = spearmanr([x for x, _ in pairs], [y for _, y in pairs]).statistic
    return None if not np.isfinite(rho) else float(rho)
