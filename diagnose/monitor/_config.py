"""MonitorConfig: every setting of a TrainingMonitor, in one frozen dataclass, checked once when built.

The one place that lists them: `TrainingMonitor(model, run_dir, **keywords)` maps its keywords onto
these fields, `TrainingMonitor(model, run_dir, config=MonitorConfig(...))` passes one whole, and the
Lightning and Hugging Face callbacks take the same config (or the same keywords) and add what their
trainer knows (the clip norm, the integration's settings, its trackers' sinks) through `with_trainer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping

from ..errors import ConfigError, UsageError
from . import _config_checks as check
from ._alerts import Thresholds


@dataclass(frozen=True)
class MonitorConfig:
    """How a TrainingMonitor measures and alerts (ConfigError at construction for a bad value).

    every: log one step in `every` (10: what a person reads, at <= 3 % of a step; hooks return at
        once on the others). Every step, logged or not, still has its loss, lr and gradient norm
        judged by loss_spike, grad_spike and nonfinite (_light.py): no spike is missed between logs.
    attention_every: sample attention statistics on logged steps divisible by it (0: never).
    clip: the max norm the loop clips gradients to, to record the clip coefficient.
    thresholds: alert thresholds (None: Thresholds()); echo: print alerts to stderr as they fire.
    settings: extra entries for run.json's "settings" (e.g. how the integration reads norms).
    raise_on: alert kinds (e.g. ("nonfinite",)) on which step() raises TrainingAlertError after
        writing the step; on_alert: a function called with each alert dict as it fires.
    save_spikes: when a grad_spike, loss_spike or nonfinite alert fires, save the batch given to
        step(batch=..., per_example_loss=...) to spikes/ in the run folder, and for a replay
        (`diagnose stats RUN --replay STEP`) the model and optimizer state and the previous logged
        step's batch: at most spike_bytes of tensors per step (the batch first; the state only when
        it fits in what is left, else the record says so) and spike_limit steps per run.
    sinks: more places each record, alert and evaluation goes (diagnose.monitor.Sink objects, e.g. a
        live tracker, or a plain function f(scalars, step)), after the run folder.
    """

    every: int = 10
    attention_every: int = 50
    thresholds: Thresholds | None = None
    clip: float | None = None
    echo: bool = True
    settings: Mapping[str, Any] = field(default_factory=dict)
    raise_on: Iterable[str] = ()
    skip_on: Iterable[str] = ()
    stop_on: Iterable[str] = ()
    on_alert: Callable[[dict[str, Any]], Any] | None = None
    save_spikes: bool = False
    spike_bytes: int = 64 << 20
    spike_limit: int = 20
    sinks: Iterable[Any] | None = ()

    def __post_init__(self) -> None:
        from ._detect import kinds
        from ._sinks import check_sinks

        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        put("every", check.count("every", self.every, 1))
        put("attention_every", check.count("attention_every", self.attention_every, 0, " (0: never)"))
        put("spike_bytes", check.count("spike_bytes", self.spike_bytes, 0))
        put("spike_limit", check.count("spike_limit", self.spike_limit, 0))
        put("clip", check.clip(self.clip))
        put("echo", check.flag("echo", self.echo))
        put("save_spikes", check.flag("save_spikes", self.save_spikes))
        put("on_alert", check.callback("on_alert", self.on_alert))
        if self.thresholds is not None and not isinstance(self.thresholds, Thresholds):
            raise UsageError(f"thresholds must be a diagnose.monitor.Thresholds, got {type(self.thresholds).__name__}")
        for name in ("raise_on", "skip_on", "stop_on"):
            put(name, check.alert_kinds(name, getattr(self, name), kinds()))
        _check_skip_on(self.skip_on)
        put("settings", check.settings(self.settings))
        put("sinks", tuple(check_sinks(self.sinks)))

    @classmethod
    def of(cls, config: "MonitorConfig | None", keywords: dict[str, Any], *,
           caller: str = "TrainingMonitor") -> "MonitorConfig":
        """`config` (default: the defaults) with `keywords` laid over it; UsageError for a keyword that is
        no setting, as Python raises for an unknown argument."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise UsageError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}; the settings are "
                             f"{', '.join(sorted(names))}")
        if config is not None and not isinstance(config, cls):
            raise UsageError(f"config must be a MonitorConfig, got a {type(config).__name__}")
        return replace(config, **keywords) if config is not None else cls(**keywords)

    def with_trainer(self, *, clip: float | None, settings: Mapping[str, Any],
                     sinks: Iterable[Any] = ()) -> "MonitorConfig":
        """This config inside a trainer's loop: its clip norm unless the config sets one, its integration's
        settings beside the config's, and its trackers' sinks after the config's."""
        return replace(self, clip=self.clip if self.clip is not None else clip,
                       settings={**self.settings, **settings}, sinks=(*self.sinks, *sinks))


def _check_skip_on(skip_on: frozenset) -> None:
    """skip_on may name only kinds judged on every step: a step can be skipped only when it is judged."""
    from ._detect import DETECTORS

    every_step = {d.kind for d in DETECTORS if d.every_step}
    bad = sorted(set(skip_on) - every_step)
    if bad:
        raise ConfigError(f"skip_on={bad} names kinds that are not judged on every step; skip_on takes "
                          f"{sorted(every_step)} (the others are seen on logged steps only: use stop_on)")
