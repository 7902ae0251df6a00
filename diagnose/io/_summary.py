"""Plain-data summaries of a loaded model and data set, and a one-batch check that they fit
together (what `diagnose info` prints)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..calling import last_position_only
from ..errors import DataError, UsageError
from ..objectives import call_model, logits_of
from ._files import one_line
from ._data import IGNORE, DataSet, check_labels, check_vocab
from ._model import tokenizer_of, vocab_size_of

# Hugging Face config fields worth one line (attribute_map resolves n_layer -> num_hidden_layers, ...).
_HF_FIELDS = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
              "intermediate_size", "vocab_size", "max_position_embeddings", "num_labels")


def describe_model(model: nn.Module) -> dict[str, Any]:
    """Class, source, format, parameter counts, config summary, tokenizer class."""
    cls = type(model)
    tok = tokenizer_of(model)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": getattr(model, "diagnose_source", None),
        "format": getattr(model, "diagnose_format", None),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "config": config_summary(model),
        "tokenizer": None if tok is None else type(tok).__name__,
    }


def config_summary(model: nn.Module) -> dict[str, Any]:
    """The diagnose ModelConfig as a dict, the main Hugging Face config fields, or {}."""
    cfg = getattr(model, "cfg", None)
    if hasattr(cfg, "to_dict") and not hasattr(cfg, "model_type"):
        return dict(cfg.to_dict())
    cfg = getattr(model, "config", None)
    if cfg is None:
        return {}
    out = {name: getattr(cfg, name) for name in _HF_FIELDS if getattr(cfg, name, None) is not None}
    if "Classification" not in type(model).__name__:
        out.pop("num_labels", None)  # every HF config has one; it means something only for classifiers
    attn = getattr(cfg, "_attn_implementation", None)
    if attn:
        out["attn_implementation"] = attn
    return out


def describe_data(data: DataSet) -> dict[str, Any]:
    """Counts, padding share and label layout and range (ignoring -100); for an ImageSet, its
    count, image size and pixel range (describe_images)."""
    if getattr(data, "main_input", "input_ids") == "pixel_values":
        from ._images import describe_images
        return describe_images(data)  # type: ignore[arg-type]
    mask = data.attention_mask
    out: dict[str, Any] = {
        "source": data.source,
        "n_examples": len(data),
        "seq_len": data.seq_len,
        "has_attention_mask": mask is not None,
        "padding_share": 0.0 if mask is None else float(1 - mask.float().mean()),
        "token_ids": [int(data.input_ids.min()), int(data.input_ids.max())],
        "labels": None,
        "has_tokens": data.tokens is not None,
    }
    if data.labels is not None:
        scored = data.labels[data.labels != IGNORE]
        out["labels"] = {
            "shape": list(data.labels.shape),
            "kind": "sequence" if data.labels.dim() == 1 else "token",
            "min": int(scored.min()),
            "max": int(scored.max()),
            "distinct": int(scored.unique().numel()),
            "scored_share": float((data.labels != IGNORE).float().mean()),
        }
    return out


@torch.no_grad()
def trial_forward(model: nn.Module, data: DataSet, n: int = 2) -> dict[str, Any]:
    """Run the first n examples through the model; check token ids and labels against its outputs."""
    images = getattr(data, "main_input", "input_ids") == "pixel_values"
    vocab = vocab_size_of(model)
    if vocab is not None and not images:
        check_vocab(data, vocab)
    inputs, _ = next(data.take(n).batches(n))
    try:
        logits = logits_of(call_model(model, inputs))
    except UsageError:  # diagnose.calling: the signature cannot take the inputs (it says which and the fix)
        raise
    except Exception as exc:  # the model's own forward can raise anything
        raise DataError(f"{data.source}: the model fails on the first examples ({type(exc).__name__}: "
                        f"{one_line(exc)}); check that the data was made for this model, or pass --forward "
                        "module:function to say how to call it") from None
    if not images:
        _try_largest_id(model, data, n)
    out = {"output_shape": list(logits.shape), "labels_fit": None,
           "last_position_only": last_position_only(logits, inputs)}
    labels = data.labels
    if labels is not None:
        # labels [N] score logits [B, C]; labels [N, T] score logits [B, T, C]
        if logits.dim() != labels.dim() + 1:
            raise DataError(f"{data.source}: labels of shape [{', '.join(['N', 'T'][:labels.dim()])}] do not "
                            f"match the model's output {list(logits.shape)}; sequence labels need logits "
                            "[B, C], token labels [B, T, C]")
        check_labels(data, int(logits.shape[-1]))
        out["labels_fit"] = True
    return out


@torch.no_grad()
def _try_largest_id(model: nn.Module, data: DataSet, n: int) -> None:
    """Run the example that holds the data set's largest token id too, when it is not among the
    first n: a model whose vocabulary diagnose cannot read (a --factory model) would otherwise
    fail with an IndexError in the middle of a sweep. One extra forward pass of one example."""
    per_row = data.input_ids.amax(dim=1)  # [N]
    row = int(per_row.argmax())
    if row < n:
        return
    try:
        call_model(model, data.inputs(row, row + 1))
    except (IndexError, RuntimeError) as exc:
        raise DataError(f"{data.source}: example {row} holds token id {int(per_row[row])}, and the model fails on "
                        f"it ({type(exc).__name__}: {one_line(exc)}); token ids must lie below the model's "
                        "vocabulary size: tokenise the data with this model's tokenizer") from None
