"""TrainingMonitor: call .step(loss) after backward() and before optimizer.step().

Per logged step it records loss, lr, the global gradient norm (pre-clip, AMP-unscaled), the
clip coefficient, per-block gradient norm and activation statistics, and on every
`attention_every`-th step per-head attention entropy and max weight. Everything is reduced
on the device and brought to the host with ONE `.tolist()` per logged step; under
torch.distributed the same vector is gathered across ranks in one collective (FSDP2's sharded
gradient norms in one more) and only rank 0 writes. Records are appended and flushed to the
run folder as they are made.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..errors import OutputError, TrainingAlertError
from ._alerts import AlertEngine, Thresholds, print_alert
from ._evals import eval_record
from ._layout import StepLayout
from ._runfolder import RunWriter
from ._spikes import SPIKE_KINDS, save_spike
from ._signals import ActivationWatch, AttentionWatch, GradNorms, find_blocks, find_sites, scaler_divisor, unwrap


def _dist_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TrainingMonitor:
    """Watch a training run and write a `diagnose.run/1` folder.

    monitor = TrainingMonitor(model, "runs/exp1")
    loss.backward(); monitor.step(loss, optimizer=opt); opt.step()

    every: log one step in `every` (hooks return at once on the others).
    attention_every: sample attention statistics on steps divisible by it (0: never).
    clip: the max norm the loop clips gradients to, to record the clip coefficient.
    thresholds: alert thresholds (Thresholds()); echo: print alerts to stderr as they fire.
    settings: extra entries for run.json's "settings" (e.g. how the integration reads norms).
    raise_on: alert kinds (e.g. ("nonfinite",)) on which step() raises TrainingAlertError after
        writing the step; on_alert: a function called with each alert dict as it fires.
    save_spikes: when a grad_spike, loss_spike or nonfinite alert fires, save the batch given to
        step(batch=..., per_example_loss=...) to spikes/ in the run folder, at most spike_bytes
        of tensors per step and spike_limit steps per run.
    """

    def __init__(self, model: nn.Module, run_dir: str | os.PathLike, *, every: int = 1,
                 attention_every: int = 50, thresholds: Thresholds | None = None,
                 clip: float | None = None, echo: bool = True, settings: dict[str, Any] | None = None,
                 raise_on: Iterable[str] = (), on_alert: Callable[[dict[str, Any]], Any] | None = None,
                 save_spikes: bool = False, spike_bytes: int = 16 << 20, spike_limit: int = 20):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if isinstance(raise_on, str):
            raise_on = (raise_on,)
        if spike_bytes < 0 or spike_limit < 0:
            raise ValueError("spike_bytes and spike_limit must be >= 0")
        self.model = unwrap(model)
        self.every, self.attention_every, self.clip, self.echo = every, attention_every, clip, echo
        self.raise_on, self.on_alert = frozenset(raise_on), on_alert
        self.save_spikes, self.spike_bytes, self.spike_limit = save_spikes, int(spike_bytes), int(spike_limit)
        self._spikes_saved = 0
        self.last_alerts: list[dict[str, Any]] = []  # the alerts of the last logged step
        self._grad_snapshot: tuple | None = None  # gradient norms read early (_capture_grads)
        self._last_logged: tuple[int, float] | None = None  # (step, perf_counter) of the last logged step
        self.thresholds = thresholds or Thresholds()
        self._extra_settings = dict(settings or {})
        self.rank, self.world = _dist_world()
        self._step = 0
        self._closed = False
        sites = find_sites(self.model)
        blocks = find_blocks(self.model, sites)
        self.block_names = [n for n, _ in blocks]
        self.site_names = [s.name for s in sites]
        self._grads = GradNorms(self.model, self.block_names)
        self._acts = ActivationWatch(self.model, blocks)
        self._attn = AttentionWatch(sites, self._acts)
        self._alerts = AlertEngine(self.thresholds, self.block_names)
        self.writer: RunWriter | None = None
        try:
            if self.rank == 0:
                self.writer = RunWriter(run_dir, self._info())
            self._arm(0)
        except BaseException:
            self._remove_hooks()
            raise

    def _info(self) -> dict[str, Any]:
        n_params = sum(p.numel() for p in self.model.parameters())
        return {
            "model": {"class": type(self.model).__name__, "n_params": n_params,
                      "blocks": self.block_names, "attention_sites": self.site_names},
            "settings": {"every": self.every, "attention_every": self.attention_every,
                         "clip": self.clip, "world_size": self.world,
                         "save_spikes": self.save_spikes, "spike_bytes": self.spike_bytes,
                         "thresholds": self.thresholds.to_dict(), **self._extra_settings},
            "clip": self.clip,
        }

    def _arm(self, step: int) -> None:
        """Prepare the hooks for the forward of `step` (the next one)."""
        self._acts.armed = step % self.every == 0
        if self._acts.armed and self.attention_every and step % self.attention_every == 0:
            self._attn.arm()

    def step(self, loss: torch.Tensor | float | None, *, optimizer: Any = None, lr: float | None = None,
             scaler: Any = None, step: int | None = None, micro_batches: int | None = None,
             tokens: int | torch.Tensor | None = None, batch: Any = None,
             per_example_loss: torch.Tensor | None = None) -> dict[str, Any] | None:
        """Record this step (after backward, before optimizer.step); returns the record on logged steps.

        loss: the optimizer step's loss; under gradient accumulation the mean over its
        micro-batches (as the trainers report it), not the last micro-batch's share.
        scaler: the torch.amp.GradScaler whose scaled loss was backpropagated; gradient norms are
        divided by its scale unless scaler.unscale_(optimizer) already ran. step: override the
        monitor's own counter (e.g. the trainer's global step, or after resuming).
        micro_batches: forwards in this step (default: counted by the block hooks).
        tokens: tokens in this step (default: batch x positions of the forwards seen, padding included).
        batch, per_example_loss: this step's inputs, saved to spikes/ when save_spikes is on and a
        spike alert fires at this step.
        """
        if self._closed:
            raise RuntimeError("TrainingMonitor.step() after close()")
        if step is not None:
            self._step = int(step)
        s = self._step
        self._step += 1
        if s % self.every != 0:
            # drop what a forward armed under another numbering left (step= jumped)
            self._acts.discard()
            self._attn.discard()
            self._grad_snapshot = None
            self._arm(self._step)
            return None
        now = time.perf_counter()
        forwards = self._acts.forwards
        try:
            record = self._measure(s, loss, optimizer, lr, scaler, tokens)
        finally:
            self._grad_snapshot = None
            self._arm(self._step)
        self._timing(record, s, now, micro_batches if micro_batches is not None else forwards)
        alerts = self._alerts.check(record, amp=scaler is not None)  # every rank: raise_on acts alike
        self.last_alerts = alerts
        if self.writer is not None:
            self.writer.write_step(record)
            for alert in alerts:
                self.writer.write_alert(alert)
                if self.echo:
                    print_alert(alert)
            self._forensics(s, alerts, batch, per_example_loss)
        for alert in alerts:
            if self.on_alert is not None:
                self.on_alert(alert)
        stop = [a for a in alerts if a["kind"] in self.raise_on]
        if stop:
            kinds = ", ".join(sorted({a["kind"] for a in stop}))
            raise TrainingAlertError(f"step {s}: {kinds} (TrainingMonitor raise_on); see {stop[0]['where']}: "
                                     f"{stop[0]['message']}", stop)
        return record

    def _timing(self, record: dict[str, Any], s: int, now: float, micro_batches: int) -> None:
        """step_time (seconds per step since the last logged step), tokens and tokens/s."""
        step_time = None
        if self._last_logged is not None and s > self._last_logged[0]:
            step_time = (now - self._last_logged[1]) / (s - self._last_logged[0])
        self._last_logged = (s, now)
        tokens = record.pop("tokens", None)
        record["micro_batches"] = max(1, int(micro_batches))
        record["step_time"] = step_time
        record["tokens"] = tokens
        record["tokens_per_s"] = (tokens / step_time if tokens is not None and step_time else None)

    def _forensics(self, s: int, alerts: list[dict[str, Any]], batch: Any, per_example_loss: Any) -> None:
        kinds = [a["kind"] for a in alerts if a["kind"] in SPIKE_KINDS]
        if (not self.save_spikes or not kinds or self._spikes_saved >= self.spike_limit
                or (batch is None and per_example_loss is None)):
            return
        try:
            save_spike(self.writer.dir, s, kinds, batch, per_example_loss, self.spike_bytes)
        except OutputError as exc:  # a full disk must not end the training run: say so and go on
            warnings.warn(f"spike batch at step {s} not saved: {exc}", RuntimeWarning, stacklevel=3)
            return
        self._spikes_saved += 1

    def log_eval(self, step: int, /, loss: float | torch.Tensor | None = None, **metrics: Any) -> dict[str, Any]:
        """Record an evaluation at `step` to evals.jsonl: {step, time, loss, metrics {name: number}}.

        `step` is positional only, so that a metric may be called anything (`step`, `self`)."""
        if self._closed:
            raise RuntimeError("TrainingMonitor.log_eval() after close()")
        record = eval_record(step, loss, metrics)
        if self.writer is not None:
            self.writer.write_eval(record)
        return record

    def _capture_grads(self, scaler: Any = None, optimizer: Any = None) -> None:
        """Read the gradient norms now (no sync) for the next step(): for integrations whose
        trainer clips between backward and the last callback before optimizer.step()."""
        norms, idx, sharded = self._grads.norms()
        if norms is not None:
            div = scaler_divisor(scaler, optimizer)
            if div is not None:
                norms = norms / div.to(norms.device)
        self._grad_snapshot = (norms, idx, sharded)

    def _expect(self, step: int) -> None:
        """The next step() will be `step` (an integration numbering steps its own way): arm for it."""
        self._acts.discard()
        self._attn.discard()
        self._step = int(step)
        self._arm(self._step)

    def will_log(self, step: int) -> bool:
        """Whether step() at this step number records it (step % every == 0)."""
        return step % self.every == 0

    def _measure(self, s: int, loss: Any, optimizer: Any, lr: Any, scaler: Any, tokens: Any) -> dict[str, Any]:
        sampled = self._attn.armed
        positions = self._acts.positions
        acts, act_present = self._acts.collect()  # [L_present, S]
        attn = self._attn.collect() if sampled else []  # per site [3, H] or None
        snapshot = self._grad_snapshot
        norms, grad_idx, sharded = snapshot if snapshot is not None else self._grads.norms()  # [P]
        dev = next((t.device for t in (norms, acts) if t is not None), None)
        if dev is None:
            dev = loss.device if isinstance(loss, torch.Tensor) else torch.device("cpu")
        if lr is None and optimizer is not None and getattr(optimizer, "param_groups", None):
            lr = optimizer.param_groups[0].get("lr")
        if isinstance(lr, torch.Tensor):
            lr = float(lr)  # tensor lr (capturable optimizers): rare; costs its own sync
        loss_t = (loss.detach().to(dev, torch.float64).reshape(-1)[:1] if isinstance(loss, torch.Tensor)
                  else torch.tensor([math.nan if loss is None else float(loss)], dtype=torch.float64, device=dev))
        layout = StepLayout.of(acts, attn, norms)
        # Parts reduced across ranks (loss, activations, attention) come first; gradient norms
        # are already global after DDP's all-reduce, so they are appended after.
        shared_v = layout.pack_shared(loss_t, acts, attn)
        if self.world > 1:
            shared_v = self._reduce(shared_v, layout)
        if norms is not None:
            if any(sharded) and self.world > 1:
                norms = self._gather_shards(norms, sharded)
            div = scaler_divisor(scaler, optimizer) if snapshot is None else None  # a snapshot is unscaled
            if div is not None:
                norms = norms / div.to(dev)
        parts = [shared_v] + ([norms] if norms is not None else [])
        if isinstance(tokens, torch.Tensor):  # counted on the device: rides along with the one sync
            parts.append(tokens.detach().to(dev, torch.float64).reshape(1))
        values = torch.cat(parts).tolist()  # the one host sync of this step
        if isinstance(tokens, torch.Tensor):
            tokens = values.pop()
        if loss is None:
            values[0] = None  # not given: null in the log, not a NaN alert
        record = self._record(s, lr, layout, values, act_present, attn, grad_idx)
        if tokens is None and positions:
            tokens = positions
        # this rank's count times the ranks (each runs the same shapes under DDP)
        record["tokens"] = None if tokens is None or not math.isfinite(tokens) else int(tokens) * self.world
        return record

    @staticmethod
    def _gather_shards(norms: torch.Tensor, sharded: list[bool]) -> torch.Tensor:
        """FSDP2: the norm of a sharded gradient from its shards' norms (sum of squares over ranks)."""
        mask = torch.tensor(sharded, device=norms.device)
        sq = norms[mask].square()
        dist.all_reduce(sq)  # SUM
        out = norms.clone()
        out[mask] = sq.sqrt()
        return out

    def _reduce(self, v: torch.Tensor, layout: StepLayout) -> torch.Tensor:
        """Average across ranks (max for max |x|), in one all_gather."""
        gathered = [torch.empty_like(v) for _ in range(self.world)]
        dist.all_gather(gathered, v.contiguous())
        return layout.reduce_ranks(torch.stack(gathered))  # [world, n] -> [n]

    def _record(self, s: int, lr: Any, layout: StepLayout, values: list[Any], act_present: list[bool],
                attn: list, grad_idx: list[int]) -> dict[str, Any]:
        loss, block_stats, site_stats, norms = layout.unpack(values)
        layers: dict[str, dict[str, Any]] = {n: {} for n in self.block_names}
        ran = iter(block_stats)
        for name, present in zip(self.block_names, act_present):
            if present:
                layers[name].update(next(ran))
        sampled = [name for name, a in zip(self.site_names, attn) if a is not None]
        attention = dict(zip(sampled, site_stats))
        sq = [0.0] * len(self.block_names)
        bad_param = None
        for i, n in zip(grad_idx, norms):
            if not math.isfinite(n) and bad_param is None:
                bad_param = self._grads.params[i][0]
            owner = self._grads.owner[i]
            if owner >= 0:
                sq[owner] += n * n
        for name, q, has in zip(self.block_names, sq, self._block_has_grad(grad_idx)):
            layers[name]["grad_norm"] = math.sqrt(q) if has else None
        grad_norm = math.sqrt(sum(n * n for n in norms)) if norms else None
        record: dict[str, Any] = {"step": s, "time": time.time(), "loss": loss, "lr": lr, "grad_norm": grad_norm}
        if self.clip is not None and grad_norm is not None:
            coef = self.clip / (grad_norm + 1e-6)  # as clip_grad_norm_; a NaN norm gives NaN (min() would say 1)
            record["clip_coef"] = coef if math.isnan(coef) else min(1.0, coef)
        record["layers"] = layers
        if attention:
            record["attention"] = attention
        if bad_param is not None:
            record["nonfinite_param"] = bad_param  # first parameter (model order) with a NaN/Inf grad
        return record

    def _block_has_grad(self, grad_idx: list[int]) -> list[bool]:
        has = [False] * len(self.block_names)
        for i in grad_idx:
            if self._grads.owner[i] >= 0:
                has[self._grads.owner[i]] = True
        return has

    def _remove_hooks(self) -> None:
        try:
            self._attn.disarm()
        finally:
            self._acts.remove()

    def close(self) -> None:
        """Remove every hook and mark the run closed; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._remove_hooks()
        finally:
            if self.writer is not None:
                self.writer.close(steps_seen=self._step)

    def __enter__(self) -> "TrainingMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort if the user forgets close()
        try:
            if not self._closed:
                self._remove_hooks()
        except Exception:
            pass
