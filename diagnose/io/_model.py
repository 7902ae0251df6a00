"""`diagnose.load_model`: one entry point for every model file format in DESIGN.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, InputFileError
from ._files import torch_load
from ._checkpoint import FORMAT, is_checkpoint, model_from_checkpoint
from ._factory import model_from_factory, read_state_dict, resolve_factory
from ._gguf import gguf_file, load_gguf
from ._hf import is_hf_folder, load_hf_folder, refuse_special_files

_FORMATS = ("a diagnose checkpoint (diagnose.save_checkpoint), a Hugging Face model folder "
            "(save_pretrained), a .gguf file (or a folder holding one), a state_dict with --factory module:function, or a pickled "
            "nn.Module with --trust-pickle")


def load_model(path: str | Path, *, factory: str | None = None, trust_pickle: bool = False,
               attn_implementation: str | None = None, forward: str | Callable | None = None) -> nn.Module:
    """Load a model file or folder and return the model in eval mode, on the CPU.

    factory: "module:function" that builds the model; `path` then holds its state_dict.
    trust_pickle: allow a fully pickled nn.Module (unpickling runs code from the file).
    attn_implementation: passed to Hugging Face models ("eager", "sdpa"); default: theirs.
    forward: fn(model, inputs) -> output, or "module:function" naming one (imported like the factory,
    user code named by the user), that diagnose calls the model with (diagnose.calling.use_forward).
    A .gguf file (or a folder holding one, without config.json) is read by transformers' GGUF reader
    and dequantised to float32 (io/_gguf.py; needs the `gguf` extra).
    The model gets `diagnose_source` (the path), `diagnose_format`, and `diagnose_tokenizer`
    (the folder's tokenizer, else None).
    """
    path = Path(path)
    if path.name == "config.json" and is_hf_folder(path.parent):
        path = path.parent  # the folder is meant
    if not path.exists():
        raise InputFileError(f"{path}: no such file or folder; give {_FORMATS}")
    gguf = None if factory else gguf_file(path)
    if gguf is not None:
        model = load_gguf(gguf, attn_implementation=attn_implementation)
    elif path.is_dir():
        if factory:
            raise ConfigError(f"{path}: --factory takes a state_dict file, not a folder")
        refuse_special_files(path)
        if not is_hf_folder(path):
            raise InputFileError(f"{path}: a folder without config.json is not a model; give {_FORMATS}")
        model = load_hf_folder(path, attn_implementation=attn_implementation)
    elif factory:
        model = model_from_factory(factory, path, trust_pickle=trust_pickle)
    elif path.suffix == ".safetensors":
        read_state_dict(path)  # a damaged file gets its own message before the advice below
        folder = f", or give the folder {path.parent} itself" if is_hf_folder(path.parent) else ""
        raise InputFileError(f"{path}: holds weights only, not the code that builds the model; "
                             f"pass --factory module:function (a function returning the model){folder}")
    else:
        model = _from_object(torch_load(path, trust_pickle=trust_pickle), path)
    model.diagnose_source = str(path)
    if forward is not None:
        from ..calling import use_forward

        use_forward(model, resolve_factory(forward, option="--forward") if isinstance(forward, str) else forward)
    if not hasattr(model, "diagnose_tokenizer"):
        model.diagnose_tokenizer = None
    return model.eval()


def _from_object(obj: Any, path: Path) -> nn.Module:
    """What a torch.load returned: a checkpoint, an unpickled module, or something we explain."""
    if is_checkpoint(obj):
        model = model_from_checkpoint(obj, path)
        model.diagnose_format = "diagnose checkpoint"
        return model
    if isinstance(obj, nn.Module):
        obj.diagnose_format = "pickled module"
        return obj
    if isinstance(obj, Mapping) and isinstance(obj.get("format"), str) and str(obj["format"]).startswith("diagnose."):
        raise InputFileError(f"{path}: is a {obj['format']} file, not a model checkpoint ({FORMAT}); "
                             "upgrade diagnose if it is a newer checkpoint format")
    if isinstance(obj, Mapping) and obj and any(isinstance(v, (torch.Tensor, Mapping)) for v in obj.values()):
        if "input_ids" in obj:
            raise InputFileError(f"{path}: is a data file (it holds input_ids); pass it with --data")
        raise InputFileError(f"{path}: holds a state_dict (weights without the code that builds the model); "
                             "pass --factory module:function (a function returning the model)")
    raise InputFileError(f"{path}: holds a {type(obj).__name__}, not a model; give {_FORMATS}")


def tokenizer_of(model: nn.Module) -> Any | None:
    """The tokenizer load_model attached (Hugging Face folders), else None."""
    return getattr(model, "diagnose_tokenizer", None)


def label2id_of(model: nn.Module) -> dict[str, int] | None:
    """A Hugging Face classifier's label names -> ids, so text data may use label names."""
    mapping = getattr(getattr(model, "config", None), "label2id", None)
    return dict(mapping) if isinstance(mapping, Mapping) and mapping else None


def vocab_size_of(model: nn.Module) -> int | None:
    """The input vocabulary size where the model states it: the rows of its input embedding
    (get_input_embeddings), else its config's vocab_size (diagnose and Hugging Face configs), else
    None (a --factory model: callers that must have a size guess it themselves, see checks)."""
    get_emb = getattr(model, "get_input_embeddings", None)
    if callable(get_emb):
        try:
            emb = get_emb()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Embedding):
            return int(emb.num_embeddings)
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    size = getattr(cfg, "vocab_size", None)
    return size if isinstance(size, int) else None


def max_positions_of(model: nn.Module) -> int | None:
    """The longest input the model's position scheme allows, where its config states it."""
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    # block_size: nanoGPT's config and minGPT's model; max_seq_len: x-transformers' TransformerWrapper
    for holder, name in [(cfg, n) for n in ("max_len", "max_position_embeddings", "n_positions", "block_size")] + \
            [(model, "max_seq_len"), (model, "block_size")]:
        size = getattr(holder, name, None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None
