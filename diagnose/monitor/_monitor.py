"""TrainingMonitor: call .step(loss) after backward() and before optimizer.step().

Every step it judges the loss and the gradient norm (_light.py: one host sync of two numbers);
per logged step (every `every`-th) it records loss, lr, the global gradient norm (pre-clip, AMP-unscaled), the
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
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..errors import ConfigError, OutputError, StateError, TrainingAlertError
from ._alerts import AlertEngine, Thresholds, print_alert
from ._config import MonitorConfig
from ._evals import eval_record
from ._layout import StepLayout
from ._measure import MEASUREMENTS, Probe, StepInputs
from ._step_args import check_step_args
from ._sinks import Guest, RunFolderSink, close_all, guest_seconds, guests
from ._spikes import SPIKE_KINDS, spike_stem
from ._actions import SkipList, act_on
from ._declare import declare
from ._light import light_record, step_lr
from ._first_forward import structural_sites, wait_for_first_forward
from ._signals import find_blocks, find_sites, is_compiled, scaler_divisor, unwrap

# a record's keys in this order (the measurements write them in theirs), then any other
_KEY_ORDER = ("step", "time", "loss", "lr", "grad_norm", "clip_coef", "layers", "attention", "nonfinite_param")


def _device(measured: list[tuple[Any, Any]]) -> torch.device:
    """Where the step vector is packed: the first accelerator a measurement's values are on, else the CPU."""
    for _, value in measured:
        for t in (value if isinstance(value, list) else [value]):
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                return t.device
    return torch.device("cpu")


def _dist_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TrainingMonitor:
    """Watch a training run and write a `diagnose.run/1` folder.

    monitor = TrainingMonitor(model, "runs/exp1")
    loss.backward(); monitor.step(loss, optimizer=opt); opt.step()

    config / **options: the settings, every one a field of MonitorConfig (diagnose/monitor/_config.py,
        which says what each does: every, attention_every, clip, thresholds, echo, settings, raise_on,
        on_alert, save_spikes, spike_bytes, spike_limit, sinks); run_dir=None keeps no run folder, only the sinks.
    example: the model's inputs (a Tensor, or a Mapping of keyword arguments) for finding its
        attention and residual blocks. Without it a family adapter finds them from the modules, and
        a model only the generic tracer knows is traced on the first forward's own arguments
        (the first step's batch), just before that forward runs, which is then measured too.
    Pass the settings as keywords, or one whole as config=MonitorConfig(...) (keywords then lay over
    it). What is measured comes from the registered measurements (_measure.py), which alerts fire
    from the registered detectors (_detect.py).

    Errors: a bad setting raises ConfigError (a ValueError), a sink without a sink's methods
    UsageError (a TypeError), step() or log_eval() after close() StateError (a RuntimeError).
    """

    def __init__(self, model: nn.Module, run_dir: str | os.PathLike | None, *, config: MonitorConfig | None = None,
                 example: Any = None, **options: Any):
        cfg = self.config = MonitorConfig.of(config, options)  # every setting checked there, once
        self.model = unwrap(model)  # names are the eager model's under DDP and torch.compile
        self.compiled = is_compiled(model)  # the attention hooks then stay (_probes.AttentionProbe)
        self.every, self.attention_every, self.clip, self.echo = cfg.every, cfg.attention_every, cfg.clip, cfg.echo
        self.raise_on, self.on_alert = cfg.raise_on, cfg.on_alert
        self.skip_on, self.stop_on = cfg.skip_on, cfg.stop_on
        self.skipped = False  # whether the last step()'s update was dropped (skip_on)
        self.skips: list[int] = []  # the steps skipped or stopped at in this session (skips.json: all of them)
        self._declared = False  # run.json lists every part's signals (_declare.py)
        self._saved: str | None = None  # the spike batch saved at the last step() (its spikes/ stem)
        self.save_spikes, self.spike_bytes, self.spike_limit = cfg.save_spikes, cfg.spike_bytes, cfg.spike_limit
        self._spikes_saved = 0
        self._previous: tuple[int, Any] | None = None  # (step, batch) of the last logged step (_forensics)
        self.last_alerts: list[dict[str, Any]] = []  # the alerts of the last logged step
        self._grad_snapshot: tuple | None = None  # gradient norms read early (_capture_grads)
        self._last_logged: tuple[int, tuple] | None = None  # (step, _timing's clocks) of the last logged step
        self.thresholds = cfg.thresholds or Thresholds()
        self._extra_settings = dict(cfg.settings)
        self.rank, self.world = _dist_world()
        self._step = 0
        self._closed = False
        user_sinks = guests(cfg.sinks)  # each behind a guard: a sink that fails is dropped, not the run
        if run_dir is None and not user_sinks:
            raise ConfigError("TrainingMonitor needs a run folder (run_dir) or at least one sink")
        self._folder = RunFolderSink(run_dir, check=self.rank == 0) if run_dir is not None else None
        self._skip_list = SkipList(run_dir if self.rank == 0 else None)  # skips.json, read when first written
        # records go to rank 0's sinks only, the run folder first (the source of truth)
        self.sinks: list[Any] = ([self._folder] if self._folder else []) + user_sinks if self.rank == 0 else []
        self._probes: list[Probe] = []
        self.sites, self.blocks, self.block_names, self.site_names = [], [], [], []
        self._waiting = None  # the pre-hook waiting for the first forward's arguments (first_forward.py)
        if example is None and not structural_sites(self.model):
            self._waiting = wait_for_first_forward(model, self._setup)
            return
        self._setup(example)

    def _setup(self, example: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        """Find the sites and blocks on `example`, make the probes (their hooks) and start the sinks."""
        self._waiting = None
        self.sites = find_sites(self.model, example)
        self.blocks = find_blocks(self.model, self.sites)
        self.block_names = [n for n, _ in self.blocks]
        self.site_names = [s.name for s in self.sites]
        self._alerts = AlertEngine(self.thresholds, self.block_names)
        try:
            for m in list(MEASUREMENTS):
                probe = m.probe(self)
                probe.measurement = m
                self._probes.append(probe)
            self._acts = self.probe("activations").watch  # forwards and positions counted by its hooks
            self._grads = self.probe("grad_norms").watch  # read early by _capture_grads
            self._acts._catch_mask(self.model, args, kwargs or {})  # the forward under way, when it is the first
            info = self._info()
            for sink in self.sinks:
                sink.start(info)
            self._arm(self._step)
        except BaseException:
            self._remove_hooks()
            raise

    def _ready(self, where: str) -> None:
        """Set up now if no forward came first (step() or close() before any forward): nothing to trace."""
        if self._waiting is not None:
            self._waiting.remove()
            if where == "step":
                warnings.warn("diagnose: TrainingMonitor.step() came before any forward of the model it was given "
                              "(a trainer that calls a submodule, not the model), so its attention and blocks "
                              "are looked for without its input: on guessed token ids, and not at all for a model "
                              "without an nn.Embedding; fix: pass example=inputs to TrainingMonitor",
                              RuntimeWarning, stacklevel=3)
            self._setup(None)

    def _info(self) -> dict[str, Any]:
        n_params = sum(p.numel() for p in self.model.parameters())
        return {
            "model": {"class": type(self.model).__name__, "n_params": n_params,
                      "blocks": self.block_names, "attention_sites": self.site_names,
                      "compiled": self.compiled, "torch": torch.__version__},
            "settings": {"every": self.every, "attention_every": self.attention_every,
                         "clip": self.clip, "world_size": self.world,
                         "save_spikes": self.save_spikes, "spike_bytes": self.spike_bytes,
                         "skip_on": sorted(self.skip_on), "stop_on": sorted(self.stop_on),
                         "thresholds": self.thresholds.to_dict(), **self._extra_settings},
            "clip": self.clip,
        }

    def probe(self, name: str) -> Probe:
        """The probe of the measurement `name` (one probe may read another's watcher)."""
        for p in self._probes:
            if p.measurement.name == name:
                return p
        raise ConfigError(f"no measurement named {name!r} is registered")

    def _arm(self, step: int) -> None:
        """Prepare the hooks for the forward of `step` (the next one)."""
        logged = step % self.every == 0
        sampled = bool(logged and self.attention_every and step % self.attention_every == 0)
        for p in self._probes:
            p.arm(step, logged, sampled)

    def _discard(self) -> None:
        for p in self._probes:
            p.discard()

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
            raise StateError("TrainingMonitor.step() after close()")
        self._ready("step")
        self._step = check_step_args(self._step, step, loss=loss, lr=lr, tokens=tokens, micro_batches=micro_batches)
        s = self._step
        self._step += 1
        if s % self.every != 0:  # a light step (_light.py): only the every-step detectors' inputs
            self._discard()  # drop what a forward armed under another numbering left (step= jumped)
            try:
                record = light_record(self, s, loss, optimizer, lr, scaler)
            finally:
                self._grad_snapshot = None
                self._arm(self._step)
            self._act(s, None, self._alerts.check(record, amp=scaler is not None, light=True),
                      optimizer, scaler, batch, per_example_loss)
            return None
        spent = guest_seconds(self.sinks)  # a slow sink's time is not the step's: sink_time holds it
        now = time.perf_counter() - spent
        forwards = self._acts.forwards
        try:
            record = self._measure(s, loss, optimizer, lr, scaler, tokens)
        finally:
            self._grad_snapshot = None
            self._arm(self._step)
        self._timing(record, s, (now, spent), micro_batches if micro_batches is not None else forwards)
        alerts = self._alerts.check(record, amp=scaler is not None)  # every rank: raise_on acts alike
        self._act(s, record, alerts, optimizer, scaler, batch, per_example_loss)
        return record

    def _act(self, s: int, record: dict[str, Any] | None, alerts: list[dict[str, Any]], optimizer: Any,
             scaler: Any, batch: Any, per_example_loss: Any) -> None:
        """Write the record (a logged step's) and the alerts, save the spike's batch, then the actions:
        on_alert, skip_on (the update dropped), stop_on and raise_on (TrainingAlertError)."""
        self.last_alerts = alerts
        if record is not None:
            for sink in self.sinks:
                sink.step(record)
            if self.rank == 0 and self._folder is not None and not self._declared:  # rank != 0 writes nothing
                declare(self._folder, record)  # run.json's per-site signals (_declare.py)
                writer = getattr(self._folder, "writer", None)
                self._declared = writer is None or "attention" in (writer.info.get("signals") or {})
        for alert in alerts:
            for sink in self.sinks:
                sink.alert(alert)
            if self.echo and self.rank == 0:
                print_alert(alert)
        self._saved = None
        if self.rank == 0 and self._folder is not None:
            self._saved = self._forensics(s, alerts, batch, per_example_loss, optimizer)
        for alert in alerts:
            if self.on_alert is not None:
                self.on_alert(alert)
        act_on(self, s, {a["kind"] for a in alerts}, optimizer, scaler)
        stop = [a for a in alerts if a["severity"] != "info"  # events never stop
                and (a["kind"] in self.raise_on or a["kind"] in self.stop_on)]
        if stop:
            kinds = ", ".join(sorted({a["kind"] for a in stop}))
            raise TrainingAlertError(f"step {s}: {kinds} (TrainingMonitor raise_on/stop_on); see {stop[0]['where']}: "
                                     f"{stop[0]['message']}", stop)

    def _timing(self, record: dict[str, Any], s: int, clocks: tuple[float, float], micro_batches: int) -> None:
        """step_time, sink_time (per step since the last logged one: training's, user sinks'), tokens, tokens/s."""
        step_time = sink_time = None
        if self._last_logged is not None and s > self._last_logged[0]:
            step_time, sink_time = ((a - b) / (s - self._last_logged[0]) for a, b in zip(clocks, self._last_logged[1]))
        self._last_logged = (s, clocks)
        tokens = record.pop("tokens", None)
        record["micro_batches"] = max(1, int(micro_batches))
        record["step_time"] = step_time
        if any(isinstance(sink, Guest) for sink in self.sinks):
            record["sink_time"] = sink_time
        record["tokens"] = tokens
        record["tokens_per_s"] = (tokens / step_time if tokens is not None and step_time else None)

    def _forensics(self, s: int, alerts: list[dict[str, Any]], batch: Any, per_example_loss: Any,
                   optimizer: Any = None) -> str | None:
        """Save the batch behind a spike alert, with the model and optimizer state and the previous
        logged step's batch for `diagnose stats --replay` (a reference to it is kept, not a copy); its
        file stem, or None when none was saved."""
        kinds = [a["kind"] for a in alerts if a["kind"] in SPIKE_KINDS]
        previous, self._previous = self._previous, ((s, batch) if self.save_spikes and batch is not None else None)
        if (not self.save_spikes or not kinds or self._spikes_saved >= self.spike_limit
                or (batch is None and per_example_loss is None)):
            return None
        try:
            self._folder.spike(s, kinds, batch, per_example_loss, self.spike_bytes, model=self.model,
                               optimizer=optimizer, previous=previous)
        except OutputError as exc:  # a full disk must not end the training run: say so and go on
            warnings.warn(f"spike batch at step {s} not saved: {exc}", RuntimeWarning, stacklevel=4)
            return None
        self._spikes_saved += 1
        return spike_stem(s)

    def log_eval(self, step: int, /, loss: float | torch.Tensor | None = None, **metrics: Any) -> dict[str, Any]:
        """Record an evaluation at `step` to evals.jsonl: {step, time, loss, metrics {name: number}}.

        `step` is positional only, so that a metric may be called anything (`step`, `self`)."""
        if self._closed:
            raise StateError("TrainingMonitor.log_eval() after close()")
        self._ready("eval")  # an evaluation before any forward of the model: the sinks start here
        record = eval_record(step, loss, metrics)
        for sink in self.sinks:
            sink.eval(record)
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
        self._discard()
        self._step = int(step)
        self._arm(self._step)

    def will_log(self, step: int) -> bool:
        """Whether step() at this step number records it (step % every == 0)."""
        return step % self.every == 0

    def _measure(self, s: int, loss: Any, optimizer: Any, lr: Any, scaler: Any, tokens: Any) -> dict[str, Any]:
        positions = self._acts.positions
        inputs = StepInputs(s, loss, optimizer, scaler, self._grad_snapshot, self.world)
        measured = [(p.measurement, p.collect(inputs)) for p in self._probes]  # on the device, no sync
        dev = _device(measured)
        lr = step_lr(lr, optimizer)
        layout = StepLayout.of(measured)
        v = layout.pack(measured, dev)  # the parts reduced across ranks first
        if self.world > 1:
            v = torch.cat([self._reduce(v[:layout.shared], layout), v[layout.shared:]])
        parts = [v]
        if isinstance(tokens, torch.Tensor):  # counted on the device: rides along with the one sync
            parts.append(tokens.detach().to(dev, torch.float64).reshape(1))
        values = torch.cat(parts).tolist()  # the one host sync of this step
        if isinstance(tokens, torch.Tensor):
            tokens = values.pop()
        record = self._record(s, lr, layout.unpack(values))
        if tokens is None and positions:
            tokens = positions
        # this rank's count times the ranks (each runs the same shapes under DDP)
        record["tokens"] = None if tokens is None or not math.isfinite(tokens) else int(tokens) * self.world
        return record

    def _reduce(self, v: torch.Tensor, layout: StepLayout) -> torch.Tensor:
        """Combine the shared part across ranks by each row's rule, in one all_gather."""
        gathered = [torch.empty_like(v) for _ in range(self.world)]
        dist.all_gather(gathered, v.contiguous())
        return layout.reduce_ranks(torch.stack(gathered))  # [world, n] -> [n]

    def _record(self, s: int, lr: Any, units: dict[str, list[dict[str, list[Any]]]]) -> dict[str, Any]:
        """The step record: each measurement writes its keys, then they are put in _KEY_ORDER."""
        record: dict[str, Any] = {"step": s, "time": time.time(), "lr": lr,
                                  "layers": {n: {} for n in self.block_names}}
        for p in self._probes:
            p.write(record, units.get(p.measurement.name, []))
        ordered = {k: record[k] for k in _KEY_ORDER if k in record}
        ordered.update(record)
        return ordered

    def _remove_hooks(self) -> None:
        """Every probe's remove(), the last one first; the first error is raised after all ran."""
        error = None
        for p in reversed(self._probes):
            try:
                p.remove()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others are removed
                error = error or exc
        if error is not None:
            raise error

    def close(self) -> None:
        """Remove every hook and mark the run closed; safe to call twice."""
        if self._closed:
            return
        self._ready("close")
        self._closed = True
        try:
            self._remove_hooks()
        finally:
            close_all(self.sinks, self._step)

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
