"""Encoder-decoder models, checked one part at a time.

An encoder-decoder (BART, T5, Whisper) given input_ids only builds its decoder input from them,
so changing the encoder's later or padded tokens changes every decoder output: the whole-model
probes would report a causal and a padding leak on a correct model. Each part is therefore
probed through a view that presents it as a model of its own, with the token interface the
checks use (forward(input_ids, attention_mask) -> one output per position):

  EncoderView  the encoder alone (its last hidden state); bidirectional by design, so the causal
               test does not apply. Padding and positions are tested on it.
  DecoderView  the whole model with one fixed encoder input (repeated over the batch), the ids
               and mask going to decoder_input_ids / decoder_attention_mask; causal by design.
               Its forward runs every attention layer (encoder, decoder, cross), so the scaling
               check is run once, here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


def is_encoder_decoder(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    return bool(getattr(cfg, "is_encoder_decoder", False)) and callable(getattr(model, "get_encoder", None))


def part_output(out: Any) -> torch.Tensor:
    """One tensor per position (or pooled) from a model or part output: logits, else the last hidden state."""
    from ..objectives import logits_of

    if getattr(out, "logits", None) is not None:
        return out.logits
    if getattr(out, "last_hidden_state", None) is not None:
        return out.last_hidden_state
    return logits_of(out)


class EncoderView(nn.Module):
    """forward(input_ids [B, T], attention_mask [B, T]) -> the encoder's last hidden state [B, T, C]."""

    is_causal = False  # an encoder sees its whole input by design

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        return part_output(self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask))


class DecoderView(nn.Module):
    """forward(input_ids [B, T], attention_mask [B, T]) -> the model's logits [B, T, V] for those
    decoder ids, the encoder reading one fixed input (`source`: a Mapping of [1, ...] tensors)."""

    is_causal = True  # a decoder must not see the tokens it is to predict

    def __init__(self, model: nn.Module, source: dict[str, torch.Tensor]):
        super().__init__()
        self.model = model
        self.config = model.config
        self.source = source

    def get_input_embeddings(self):
        dec = self.model.get_decoder() if callable(getattr(self.model, "get_decoder", None)) else None
        emb = getattr(dec, "embed_tokens", None)
        return emb if isinstance(emb, nn.Embedding) else self.model.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None):
        B = input_ids.shape[0]
        dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), None)
        src = {k: v.to(input_ids.device, dtype if v.is_floating_point() and dtype is not None else v.dtype)
               .expand(B, *v.shape[1:]) for k, v in self.source.items()}  # float64 in the positions check's copy
        out = self.model(**src, decoder_input_ids=input_ids, decoder_attention_mask=attention_mask)
        return part_output(out)
