"""Logits only where they are scored.

A next-token task often scores a few positions of each example (IOI: the answer's, labels -100
elsewhere), yet a language model's output layer makes logits for every position over the whole
vocabulary: [B, T, V], 49,152 wide for SmolLM2, so the unembedding and the log-softmax cost more
than a layer, and the memory plan had to cut batches for a tensor that is read at 1 position in 15.

The output layer maps each position on its own (a linear unembedding, a per-position MLM head), so
its input can be cut to the scored positions first: a forward pre-hook on it gathers the hidden
state [N, T, d] at `index` [B, S] (each example's scored positions, valid ones first, S the most any
example has) into [N, S, d], and the model's logits come out [N, S, V]; the targets are gathered the
same way, padded slots IGNORE. N = K * B for K replicas (replica-major, as prefix.repeat_batch makes
them). The adapter declares the module (`output_layer(model)`, Hugging Face: get_output_embeddings).

Exact by construction where that module is per-position and runs once per forward; `ScoredOnly.check`
makes sure on the first batch (one example, the full logits at the scored positions against the gathered
ones, within the tolerance policy) and turns the cut off with one line why when it does not hold.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from .._tolerance import close, model_size
from ..adapters import hooks
from ..adapters.base import AttentionSite
from ..objectives import IGNORE, call_model, logits_of

SHARE = 0.5  # cut only when at most this share of the positions is scored (else the gather saves little)


def output_layer(model: nn.Module, sites: Sequence[AttentionSite]) -> nn.Module | None:
    """The module the adapter declares as the model's per-position output layer, or None."""
    declared = getattr(sites[0].adapter, "output_layer", None) if sites else None
    return None if declared is None else declared(getattr(model, "_orig_mod", model))


def positions(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(index [B, S], targets [B, S]) of the scored positions of targets [B, T], valid ones first in
    position order; None when the targets are not per position or most positions are scored."""
    if targets.dim() != 2 or targets.shape[1] < 2:
        return None
    valid = targets != IGNORE  # [B, T]
    S = int(valid.sum(1).max())
    if S == 0 or S > SHARE * targets.shape[1]:
        return None
    index = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :S]  # [B, S]
    return index, targets.gather(1, index)  # a padded slot points at an unscored position: IGNORE


class ScoredOnly:
    """The gather on one model's output layer; `reason` says why it is off (None: on or not yet checked)."""

    def __init__(self, module: nn.Module | None):
        self.module = module
        self.checked = False
        self.reason: str | None = None if module is not None else "the adapter declares no output layer"
        self.calls = 0
        self.used = False  # a forward ran with the cut

    @property
    def on(self) -> bool:
        return self.module is not None

    @contextmanager
    def at(self, index: torch.Tensor | None) -> Iterator[None]:
        """While active, the output layer sees only positions `index` [B, S] of each of its N = K * B rows."""
        if index is None or self.module is None:
            yield
            return
        self.used = True

        def pre(_m: nn.Module, args: tuple) -> tuple:
            self.calls += 1
            h = args[0]  # [N, T, d]
            B, N = index.shape[0], h.shape[0]
            assert h.dim() == 3 and N % B == 0, f"output layer input {tuple(h.shape)} for an index of {B} rows"
            rows = index.to(h.device).repeat(N // B, 1)  # [N, S]
            return (h.gather(1, rows[..., None].expand(-1, -1, h.shape[-1])), *args[1:])

        with hooks(lambda: self.module.register_forward_pre_hook(pre)):
            yield

    def check(self, model: nn.Module, sites: Sequence[AttentionSite], one: Any, index: torch.Tensor) -> bool:
        """Once: the gathered logits of `one` (the batch's first example, inputs cut to it) equal the full
        logits at its scored positions; else the cut is off for good and `reason` says why."""
        if self.checked or self.module is None:
            return self.module is not None
        self.checked = True
        with torch.no_grad():
            full = logits_of(call_model(model, one))  # [1, T, V]
            self.calls = 0
            with self.at(index[:1]):
                cut = logits_of(call_model(model, one))  # [1, S, V]
        want = full[:, index[0]] if full.dim() == 3 and full.shape[1] > int(index.max()) else None
        if self.calls != 1 or want is None or cut.shape != want.shape:
            self.reason = (f"the output layer ran {self.calls} time(s) in one forward or its logits were not "
                           f"per position ({tuple(cut.shape)})")
        elif not close(cut, want, **dict(zip(("depth", "width"), model_size(sites))))[0]:
            self.reason = "the logits at the scored positions differ when the output layer sees only them"
        if self.reason is not None:
            self.module = None
        return self.module is not None

    def to_json(self) -> dict[str, Any]:
        """Whether the logits were made at the scored positions only, and if not, why (result.timing)."""
        reason = self.reason if self.module is None else (None if self.used else
                                                          f"more than {SHARE:.0%} of the positions are scored")
        return {"used": self.used, "reason": reason}
