"""One exception family: every user mistake raises a DiagnoseError, and the CLI turns any
DiagnoseError into one line and exit code 2.

DataError and ConfigError are also ValueErrors, UsageError a TypeError and StateError a
RuntimeError, so callers who catch the built-in for a bad value, a wrong type or a call out of
order catch these too. Every class here is exported from `diagnose` as well (`diagnose.DataError`).
"""

from __future__ import annotations


class DiagnoseError(Exception):
    """Base of every error diagnose raises on purpose; its message is meant for the user."""


class InputFileError(DiagnoseError):
    """A model or data file is missing, unreadable, or not in a format diagnose knows."""


class UnsafePickleError(InputFileError):
    """Loading the file would unpickle arbitrary code and the user did not allow it."""


class DataError(DiagnoseError, ValueError):
    """Data has the wrong shape, dtype or values (labels out of range, empty, no tokenizer).

    Also a ValueError, so that callers who catch the built-in for a bad value catch this too."""


class ConfigError(DiagnoseError, ValueError):
    """A setting or model configuration value is not valid (also a ValueError)."""


class UsageError(DiagnoseError, TypeError):
    """A call passes the wrong kind of object (a step that is not an int, a model that is not an nn.Module).

    Also a TypeError, as Python itself raises for a wrong argument type."""


class StateError(DiagnoseError, RuntimeError):
    """A call comes out of order: a monitor used after close(), a result read before it exists."""


class NoAttentionFoundError(DiagnoseError):
    """No attention layer could be located in the model."""


class RunFolderError(DiagnoseError):
    """A folder is not a diagnose run folder, or holds no records yet."""


class OutputError(DiagnoseError):
    """An output path cannot or must not be written (an input, a device, read-only, disk full)."""


class NonFiniteError(DiagnoseError):
    """The model's outputs hold NaN or inf (e.g. NaN weights): no analysis of them would mean anything."""


class TrainingAlertError(DiagnoseError):
    """TrainingMonitor(raise_on=...) saw an alert of a kind the user asked to stop on.

    `alerts` holds the alert records that fired (already written to alerts.jsonl)."""

    def __init__(self, message: str, alerts: list | None = None):
        super().__init__(message)
        self.alerts = list(alerts or [])


class DistributedError(DiagnoseError):
    """Another rank of a torch.distributed group failed; this rank stops too, with that rank's message."""

    _diagnose_ranks_told = True  # the other ranks know already: do not tell them again (see _distributed.py)


__all__ = ["ConfigError", "DataError", "DiagnoseError", "DistributedError", "InputFileError", "NoAttentionFoundError",
           "NonFiniteError", "OutputError", "RunFolderError", "StateError", "TrainingAlertError", "UnsafePickleError",
           "UsageError"]
