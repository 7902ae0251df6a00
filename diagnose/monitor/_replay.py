"""`diagnose.monitor.replay(run, step, model)`: a saved spike replayed, explained and cured.

The batch, the model and optimizer state and the previous logged batch saved with a spike
(_spike_state.py) are loaded into the caller's model object; the step is replayed under a
TrainingMonitor of its own (every signal measured, attention sampled), and compared with the run's
recorded history before the step: each block's share of the gradient norm and of its rise, the heads
whose max logit rose or whose entropy fell, the examples with the largest loss. Then every cure
(_replay_cures.py) is applied to the same restored state and judged by the loss after the update.
Data first (Replay -> to_dict, schema diagnose.replay/1), rendering in _replay_view.py.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ..errors import RunFolderError
from ._replay_cures import StepContext, default_loss, try_cures
from ._replay_load import MAX_STATE_SLACK, as_batch, build_optimizer, load_model_state, load_tensors, spike_record
from ._runfolder import Run, read_run

SCHEMA = "diagnose.replay/1"
HISTORY = 20  # logged steps before the spike whose median is a block's baseline
HEAD_HISTORY = 5  # attention samples before the spike whose median is a head's (the recent level: attention changes as it learns)
TOP = 5


@dataclass
class Replay:
    """A replayed spike: what reproduced, what drove it, and which cures would have kept the loss down."""

    step: int
    kinds: list[str]
    reproduced: dict[str, Any]  # loss and grad norm recorded at the step and replayed
    blocks: list[dict[str, Any]]  # per block: grad_norm, before (median), ratio, share, rise_share
    heads: list[dict[str, Any]]  # per head, most risen first: site, head, max_logit, entropy and their before
    examples: list[dict[str, Any]]  # the TOP examples by loss: index, loss
    before: dict[str, Any]  # the loss before the update, on the same batch and the held-out one
    cures: list[dict[str, Any]]
    holdout: str
    notes: list[str] = field(default_factory=list)

    @property
    def kept_down(self) -> list[str]:
        """The cures tried that kept the loss down."""
        return [c["cure"] for c in self.cures if c["kept_down"]]

    def to_dict(self) -> dict[str, Any]:
        from ._replay_view import verdict

        out = {"schema": SCHEMA, **asdict(self), "kept_down": self.kept_down}
        out["verdict"] = verdict(out)
        return out


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else None


def _blocks(rec: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each block's gradient norm at the step against its median over the history, its share of the
    squared norm over blocks, and its share of the squared norm's rise above the history (what drove it)."""
    rows = []
    for name, fields in (rec.get("layers") or {}).items():
        gn = fields.get("grad_norm")
        before = _median([(r.get("layers") or {}).get(name, {}).get("grad_norm") for r in history])
        rows.append({"block": name, "grad_norm": gn, "before": before,
                     "ratio": gn / before if gn is not None and before else None})
    total = sum(r["grad_norm"] ** 2 for r in rows if r["grad_norm"] is not None) or 1.0
    rise = [max((r["grad_norm"] or 0.0) ** 2 - (r["before"] or 0.0) ** 2, 0.0) for r in rows]
    for r, up in zip(rows, rise):
        r["share"] = (r["grad_norm"] or 0.0) ** 2 / total
        r["rise_share"] = up / (sum(rise) or 1.0)
    return sorted(rows, key=lambda r: -r["rise_share"])


def _heads(rec: dict[str, Any], run: Run, step: int) -> list[dict[str, Any]]:
    """Per head: max logit and entropy at the replayed step, their medians over the run's last HEAD_HISTORY
    samples before it, and `rise` (the max logit's ratio to its median; the entropy's fall in nats)."""
    past = run.attention[run.attention["step"] < step] if len(run.attention) else run.attention
    rows = []
    for site, stats in (rec.get("attention") or {}).items():
        logits, ents = stats.get("max_logit") or [], stats.get("entropy") or []
        for h in range(max(len(logits), len(ents))):
            hist = past[(past["site"] == site) & (past["head"] == h)].tail(HEAD_HISTORY) if len(past) else past
            col = (lambda c: _median(hist[c].tolist()) if c in hist else None)
            row = {"site": site, "head": h, "max_logit": logits[h] if h < len(logits) else None,
                   "max_logit_before": col("max_logit"), "entropy": ents[h] if h < len(ents) else None,
                   "entropy_before": col("entropy")}
            lb, lv = row["max_logit_before"], row["max_logit"]
            row["logit_ratio"] = lv / lb if lv is not None and lb and lb > 0 else None
            eb, ev = row["entropy_before"], row["entropy"]
            row["entropy_fall"] = eb - ev if eb is not None and ev is not None else None
            rows.append(row)
    return sorted(rows, key=lambda r: (-(r["logit_ratio"] or 0.0), -(r["entropy_fall"] or 0.0)))


def _record_at(model: torch.nn.Module, ctx: StepContext, clip: float | None) -> tuple[dict[str, Any], torch.Tensor]:
    """The replayed step measured by a TrainingMonitor of its own (no run folder; its hooks removed in
    close()): (its record, the per-example loss [B])."""
    from ._monitor import TrainingMonitor

    mon = TrainingMonitor(model, None, sinks=[lambda scalars, step: None], every=1, attention_every=1,
                          echo=False, clip=clip)
    try:
        per = ctx.backward()
        rec = mon.step(per.float().mean(), optimizer=ctx.optimizer, step=0)
    finally:
        mon.close()
    ctx.restore()
    return rec, per


def replay(run: Run | str, step: int, model: torch.nn.Module, *,
           loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
           optimizer_factory: Callable[[list[dict[str, Any]]], Any] | None = None,
           holdout: Any = None) -> Replay:
    """Replay the spike saved at `step` of `run` (a Run or its folder) on `model`, a model object of the
    run's architecture (its weights are replaced by the saved ones).

    loss_fn(model, batch) -> per-example loss [B] (default: cross-entropy for (inputs, targets) or a dict
    with labels, _replay_cures.default_loss). optimizer_factory(param_groups) -> optimizer, for an
    optimizer torch.optim's SGD/Adam/AdamW are not (its state is still loaded from the folder).
    holdout: a batch to judge the cures on (default: the previous logged batch saved with the spike).
    """
    run = read_run(run) if not isinstance(run, Run) else run
    rec = spike_record(run.dir, step, [s["step"] for s in run.spikes])
    where = f"{run.dir}/spikes step {step}"
    state = rec.get("state")
    if state is None:
        why = rec.get("state_note") or ("the folder was written before spike replay existed (only the batch "
                                        "was saved)")
        raise RunFolderError(f"{where}: no model state was saved with this spike ({why}); nothing to replay")
    tensors = load_tensors(run.dir, state["file"], int(state.get("bytes") or 0) + MAX_STATE_SLACK)
    load_model_state(model, tensors, where)
    optimizer = build_optimizer(model, state.get("optimizer"), tensors, optimizer_factory, where)
    batch_file = f"step_{step:08d}.safetensors"
    batch = as_batch(load_tensors(run.dir, batch_file, int(rec.get("bytes") or 0) + MAX_STATE_SLACK))
    notes, label = [], "none"
    if holdout is not None:
        label = "the batch given"
    elif rec.get("previous"):
        prev = rec["previous"]
        holdout = as_batch(load_tensors(run.dir, prev["file"], int(prev.get("bytes") or 0) + MAX_STATE_SLACK))
        label = f"the batch of step {prev['step']}"
    else:
        notes.append("no held-out batch: the cures are judged on the spike's own batch")
    if rec.get("truncated"):
        notes.append(f"the saved batch was cut ({rec.get('note')}): the replay sees only those examples")
    if rec.get("state_note"):
        notes.append(rec["state_note"])
    clip = run.info.get("clip")
    ctx = StepContext(model, optimizer, batch, loss_fn or default_loss, clip if isinstance(clip, (int, float)) else None)
    measured, per = _record_at(model, ctx, ctx.clip)
    return _explain(run, step, rec, measured, per, ctx, holdout, label, notes)


def _explain(run: Run, step: int, rec: dict[str, Any], measured: dict[str, Any], per: torch.Tensor,
             ctx: StepContext, holdout: Any, label: str, notes: list[str]) -> Replay:
    history = [r for r in run.records if r["step"] < step][-HISTORY:]
    recorded = next((r for r in run.records if r["step"] == step), {})
    reproduced = {"loss_recorded": recorded.get("loss"), "loss_replayed": float(per.float().mean()),
                  "grad_norm_recorded": recorded.get("grad_norm"), "grad_norm_replayed": measured.get("grad_norm")}
    lr, lp = reproduced["loss_recorded"], reproduced["loss_replayed"]
    if lr is not None and math.isfinite(lr) and abs(lp - lr) > 1e-3 + 1e-2 * abs(lr):
        notes.append(f"the replayed loss {lp:.6g} is not the recorded {lr:.6g}: the loss function or the batch is "
                     "not the loop's (pass loss_fn; a cut batch or dropout also differ)")
    grads = _median([r.get("grad_norm") for r in history])
    past_logits = run.attention[run.attention["step"] < step] if len(run.attention) else run.attention
    cap = (float(past_logits["max_logit"].max()) if "max_logit" in past_logits and past_logits["max_logit"].notna().any()
           else None)
    before, cures = try_cures(ctx, holdout, grads, cap)
    order = torch.argsort(per.float().nan_to_num(nan=-math.inf), descending=True)[:TOP].tolist()
    return Replay(step, list(rec.get("kinds", [])), reproduced, _blocks(measured, history), _heads(measured, run, step),
                  [{"index": i, "loss": float(per[i])} for i in order], before, cures, label, notes)
