"""GGUF files (llama.cpp's format), read by transformers' own GGUF reader and dequantised to float32.

A .gguf file holds a decoder LM's configuration, weights (often 4-bit) and tokenizer. transformers
reads it with the `gguf` package (`pip install 'diagnose-transformers[gguf]'`); nothing in the file
is code, and every from_pretrained gets trust_remote_code=False. The weights are dequantised at
load (GgufConfig(dequantize=True) where transformers has it: its packed-weight kernels would hide
the per-head projections diagnose gates and prune cuts) and the quantizer is detached, so the
model is a plain float32 model: it saves with save_pretrained and reloads in plain transformers.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..errors import ConfigError, InputFileError
from ._files import one_line

SUFFIX = ".gguf"
EXTRA = "pip install 'diagnose-transformers[gguf]' (the gguf package; transformers and accelerate read it)"


def gguf_file(path: Path) -> Path | None:
    """The .gguf file `path` names: itself, or the one .gguf in a folder without config.json; else None."""
    if path.is_file() and path.suffix.lower() == SUFFIX:
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.glob("*" + SUFFIX) if p.is_file())
    if len(found) > 1:
        raise InputFileError(f"{path}: holds {len(found)} .gguf files ({', '.join(p.name for p in found[:3])}); "
                             "give the one to load")
    return found[0] if found else None


def _transformers(file: Path) -> Any:
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"reading a .gguf file needs the {module} package, which is not installed: {EXTRA}")
    import transformers

    blind = gguf_unseen(transformers)
    if blind:
        raise ConfigError(f"reading {file}: {blind}")
    return transformers


def gguf_unseen(transformers: Any) -> str | None:
    """Why this transformers cannot use the installed gguf package, or None when it can.

    transformers 5.0 reads gguf's version from the distribution metadata; on Python 3.10 that lookup
    (importlib.metadata.packages_distributions, top_level.txt only) misses gguf's wheel, the version
    reads as 'N/A' and every GGUF load fails with "Invalid version: 'N/A'"."""
    try:
        seen = transformers.utils.import_utils.is_gguf_available()
    except Exception as exc:  # packaging's InvalidVersion, from the lookup above
        return (f"transformers {transformers.__version__} cannot read the gguf package's version "
                f"({one_line(exc)}); upgrade transformers (pip install -U transformers) or use Python 3.11+")
    if not seen:
        return f"transformers {transformers.__version__} does not see a usable gguf package: {EXTRA}"
    return None


def load_gguf(file: Path, *, attn_implementation: str | None = None) -> nn.Module:
    """The causal LM in `file`, dequantised to float32, with its tokenizer as model.diagnose_tokenizer."""
    from ._hf import _quiet, model_class

    transformers = _transformers(file)
    where = {"pretrained_model_name_or_path": file.parent, "gguf_file": file.name}
    with _quiet(transformers), _no_dequantise_bar(transformers):
        try:
            config = transformers.AutoConfig.from_pretrained(**where, local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # ValueError (an architecture transformers cannot read from GGUF), OSError
            raise InputFileError(f"{file}: transformers cannot read its configuration ({one_line(exc)}); "
                                 "give a GGUF file of an architecture transformers supports (llama, mistral, "
                                 "qwen2, gpt2, ...)") from None
        cls = model_class(transformers, config, file)
        if cls is transformers.AutoModel:  # GGUF files hold language models: keep their output head
            cls = transformers.AutoModelForCausalLM
        kwargs: dict[str, Any] = {"config": config, "dtype": torch.float32, "local_files_only": True,
                                  "trust_remote_code": False}
        if hasattr(transformers, "GgufConfig"):
            kwargs["quantization_config"] = transformers.GgufConfig(gguf_file=file.name, dequantize=True)
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        try:
            model = cls.from_pretrained(**where, **kwargs)
        except Exception as exc:  # ValueError, OSError, RuntimeError from the reader or the dequantiser
            raise InputFileError(f"{file}: {cls.__name__} could not load it ({one_line(exc)})") from None
        _detach_quantizer(model)
        model.diagnose_tokenizer = _tokenizer(file, transformers)
    model.diagnose_format = "GGUF file (dequantised to float32)"
    return model.eval()


@contextlib.contextmanager
def _no_dequantise_bar(transformers: Any) -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF tensors"), which
    its disable_progress_bar() does not reach: silenced here, so that the CLI prints only its own lines."""
    import functools

    name = f"{transformers.__name__}.modeling_gguf_pytorch_utils"
    reader = importlib.import_module(name) if importlib.util.find_spec(name) else None
    bar = getattr(reader, "tqdm", None)
    if bar is None:  # a transformers whose reader draws no module-level bar: nothing to silence
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def _detach_quantizer(model: nn.Module) -> None:
    """Forget the GGUF quantizer on a dequantised model (its weights are plain tensors by now), so that
    save_pretrained writes an ordinary folder instead of refusing a 'non-serializable' quantization."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for name in ("hf_quantizer", "quantization_method"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "quantization_config"):
        del config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def _tokenizer(file: Path, transformers: Any) -> Any:
    try:
        return transformers.AutoTokenizer.from_pretrained(  # trust_remote_code=False: nothing from the folder runs
            file.parent, gguf_file=file.name, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # a GGUF without tokenizer metadata, or one transformers cannot convert
        raise InputFileError(f"{file}: its tokenizer cannot be read ({one_line(exc)}); pass token ids "
                             "(.pt data) instead of text") from None


def tokenizer_of_path(path: Path) -> Any:
    """The tokenizer of a .gguf file (or a folder holding one) or of a Hugging Face folder, without the weights."""
    from ._hf import load_tokenizer

    file = gguf_file(path)
    if file is not None:
        transformers = _transformers(file)
        from ._hf import _quiet

        with _quiet(transformers):
            return _tokenizer(file, transformers)
    tokenizer = load_tokenizer(path) if path.is_dir() else None
    if tokenizer is None:
        raise InputFileError(f"{path}: has no tokenizer; give a .gguf file or a model folder with tokenizer files")
    return tokenizer
