"""check_model on an encoder-decoder: the encoder and the decoder checked separately through
the views of _parts.py, their findings titled and their check names prefixed by the part."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ._subject import model_info, real_rows
from ._finding import Findings
from ._inputs import check_continuous, input_kind, probe_inputs
from ._parts import DecoderView, EncoderView

_SCALING_ONCE = "measured once, on the decoder's pass, which runs every attention layer (encoder, decoder, cross)"


def _source(model: nn.Module, data: Any, kind: str, opts: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One encoder input [1, ...] the decoder probes all read: the data's first example, else random."""
    if kind != "input_ids":
        return {kind: probe_inputs(model, data, kind, 1, opts["seed"])}
    view = EncoderView(model)
    ids = real_rows(data, model_info(view), n=1, length=opts["length"], seed=opts["seed"] + 7)  # [1, T]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class _Encoder(nn.Module):
    """The encoder of a model whose main input is not ids, called with that input by name."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.config, self.main_input_name = model, model.config, kind

    def forward(self, **inputs):
        return self.model.get_encoder()(**inputs)


def check_encoder_decoder(model: nn.Module, data: Any, names: list[str], causal: bool | None,
                          opts: dict[str, Any]) -> Findings:
    from ._runner import check_tokens

    kind = input_kind(model)
    enc_skip = {"causal": "an encoder reads its whole input by design (bidirectional)", "scaling": _SCALING_ONCE}
    if kind == "input_ids":
        enc = check_tokens(EncoderView(model), data, names, False, opts, skip=enc_skip)
    else:
        enc = check_continuous(_Encoder(model, kind), data, names, kind, opts, skip={"scaling": _SCALING_ONCE})
    # the decoder reads random tokens from its own vocabulary (the data's tokens are the encoder's)
    dec = check_tokens(DecoderView(model, _source(model, data, kind, opts)), None, names,
                       True if causal is None else causal, opts)
    result = Findings(model={"family": type(model).__name__, "input": kind, "encoder_decoder": True,
                             "n_parameters": sum(p.numel() for p in model.parameters()),
                             "encoder": enc.model, "decoder": dec.model, "causal_requested": causal})
    return result.merge(enc, part="encoder").merge(dec, part="decoder")
