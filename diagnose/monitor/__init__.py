"""Training health: TrainingMonitor writes a diagnose.run/1 folder; read_run reads it back.

Plug-in points: a measurement (Measurement + its probe and its record fields, register_measurement;
every reader of a run walks the fields: record_fields, field_of, record_keys), an alert kind
(a Detector subclass, register_detector) and an output (a Sink subclass, TrainingMonitor(sinks=);
live trackers: TensorBoardSink, WandbSink, MLflowSink, a plain function).
"""

from ._actions import read_skips
from ._alerts import Thresholds
from ._config import MonitorConfig
from ._detect import Context, Detector, register_detector, unregister_detector
from ._lacking import lacking_lines, lacking_signals
from ._measure import Measurement, StepInputs, record_field, register_measurement, unregister_measurement
from ._fields import MONITOR_FIELDS, field_of, record_fields, record_keys
from ._monitor import TrainingMonitor
from ._runfolder import Run, read_run
from ._follow import follow
from ._heads_summary import head_event_lines, head_rows, heads_summary
from ._stepview import render_step, step_view
from ._replay import Replay, replay
from ._replay_view import render_replay
from ._summary import alert_line, render as render_summary, summarize
from ._tensorboard import export_tensorboard
from ._live import CallableSink, LiveSink
from ._live_trackers import LightningLoggersSink, MLflowSink, TensorBoardSink, WandbSink
from ._sinks import RunFolderSink, Sink

__all__ = ["TrainingMonitor", "MonitorConfig", "Thresholds", "Run", "read_run", "Sink", "RunFolderSink", "LiveSink",
           "CallableSink", "TensorBoardSink", "WandbSink", "MLflowSink", "LightningLoggersSink", "Measurement",
           "StepInputs", "register_measurement", "unregister_measurement", "Detector", "Context",
           "register_detector", "unregister_detector", "record_field", "record_fields", "field_of", "record_keys",
           "MONITOR_FIELDS", "lacking_lines", "lacking_signals", "read_skips",
           # the read side `diagnose stats` prints with: a run's summary, one step, live following, TensorBoard
           "summarize", "render_summary", "alert_line", "step_view", "render_step", "follow", "export_tensorboard",
           # a saved spike replayed: what drove it and which cures would have kept the loss down
           "replay", "Replay", "render_replay",
           "heads_summary", "head_event_lines", "head_rows"]
