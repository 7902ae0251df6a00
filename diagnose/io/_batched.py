"""What every data set of the CLI shares: (inputs, labels) batches in order, from its own `inputs`."""

from __future__ import annotations

from typing import Any, Iterator

from ..errors import ConfigError


class Batched:
    """A mixin for data sets with `__len__`, `inputs(start, stop)` and `labels` ([N] or [N, T], or None)."""

    labels: Any

    def batches(self, batch_size: int) -> Iterator[tuple[dict[str, Any], Any]]:
        """(inputs, labels) pairs in order: the `data` that ablate_heads and capture take."""
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        for start in range(0, len(self), int(batch_size)):  # type: ignore[arg-type]
            stop = start + int(batch_size)
            yield self.inputs(start, stop), None if self.labels is None else self.labels[start:stop]  # type: ignore[attr-defined]
