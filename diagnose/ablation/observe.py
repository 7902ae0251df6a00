"""One pass over the data with an observer on every head gate: how a method's `prepare` reads each
head's clean outputs (mean averages them, resample records its donors'). The observers always come off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import torch

    from .sweep import Sweep

Observer = Callable[["torch.Tensor"], None]  # receives one site's head outputs [B, T, H, D]


def observe_heads(sweep: "Sweep", batches: Sequence[tuple[Any, Any]], first: int,
                  observer: Callable[[int], Observer], before: Callable[[Any, "torch.Tensor"], None],
                  tick: Callable[[], None] | None = None) -> None:
    """A no-grad forward of each batch with `observer(site)` on each gate; `before(inputs, rows)` runs first
    for each batch (rows [B]: the data set's index of each example, counted from `first`)."""
    import torch

    from ..objectives import batch_size_of, call_model
    from .steps import indexed

    try:
        for s, gate in enumerate(sweep.gates):
            gate.observer = observer(s)
        with torch.no_grad():
            for inputs, _, rows in indexed(batches, first):
                before(inputs, rows)
                call_model(sweep.model, inputs)
                sweep.count_forward(batch_size_of(inputs))
                if tick:
                    tick()
    finally:
        for gate in sweep.gates:
            gate.observer = None
