"""Training health: TrainingMonitor writes a diagnose.run/1 folder; read_run reads it back.

Plug-in points: a measurement (Measurement + its probe and its record fields, register_measurement;
every reader of a run walks the fields: record_fields, field_of, record_keys), an alert kind
(a Detector subclass, register_detector) and an output (a Sink subclass, TrainingMonitor(sinks=);
live trackers: TensorBoardSink, WandbSink, MLflowSink, a plain function).
"""

from ._alerts import Thresholds
from ._detect import Context, Detector, register_detector, unregister_detector
from ._measure import Measurement, StepInputs, record_field, register_measurement, unregister_measurement
from ._fields import MONITOR_FIELDS, field_of, record_fields, record_keys
from ._monitor import TrainingMonitor
from ._runfolder import Run, read_run
from ._live import CallableSink, LiveSink
from ._live_trackers import LightningLoggersSink, MLflowSink, TensorBoardSink, WandbSink
from ._sinks import RunFolderSink, Sink

__all__ = ["TrainingMonitor", "Thresholds", "Run", "read_run", "Sink", "RunFolderSink", "LiveSink",
           "CallableSink", "TensorBoardSink", "WandbSink", "MLflowSink", "LightningLoggersSink", "Measurement",
           "StepInputs", "register_measurement", "unregister_measurement", "Detector", "Context",
           "register_detector", "unregister_detector", "record_field", "record_fields", "field_of", "record_keys",
           "MONITOR_FIELDS"]
