"""Data files: tensors (.pt / .safetensors / .npz) with input_ids [N, T], optional
attention_mask [N, T], optional labels ([N] or [N, T]) and, beside them, optional wrong_labels
(a wrong answer per scored unit, shaped like labels: the logit difference metric); raw uint16 token streams (nanoGPT's
.bin, see _token_stream.py); or text (.jsonl / .csv, see _text.py). Token ids may be any integer
dtype, uint16 and uint32 included (widened to int64).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from .._write import atomic_write
from ..errors import DataError, InputFileError
from ._batched import Batched
from ._files import one_line, require_file, torch_load

IGNORE = -100
TENSOR_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz")
TEXT_SUFFIXES = (".jsonl", ".csv")
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# numpy's unsigned ids (nanoGPT's uint16 .bin, a uint32 vocabulary over 65,535): widened to int64
# exactly (torch has few operations for them, not even max)
_UINT_DTYPES = (torch.uint16, torch.uint32)


@dataclass
class DataSet(Batched):
    """Token ids with optional mask and labels; `batches` yields (inputs, labels) pairs."""

    input_ids: torch.Tensor  # [N, T] int64
    attention_mask: torch.Tensor | None = None  # [N, T] int64, 1 = real token, 0 = padding
    labels: torch.Tensor | None = None  # [N] or [N, T] int64, -100 = not scored
    source: str = ""
    tokens: list[list[str]] | None = None  # token strings per example, when a tokenizer is known
    token_type_ids: torch.Tensor | None = None  # [N, T] int64, sentence-pair text only
    wrong_labels: torch.Tensor | None = None  # like labels: a wrong answer per unit (-100: none), for logit diffs

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def inputs(self, start: int = 0, stop: int | None = None) -> dict[str, torch.Tensor]:
        """Model keyword inputs for examples [start, stop): input_ids, and the mask when present."""
        out = {"input_ids": self.input_ids[start:stop]}
        if self.attention_mask is not None:
            out["attention_mask"] = self.attention_mask[start:stop]
        if self.token_type_ids is not None:
            out["token_type_ids"] = self.token_type_ids[start:stop]
        return out

    def take(self, n: int) -> "DataSet":
        """The first n examples (all of them when n >= len)."""
        cut = slice(0, int(n))
        return replace(self, input_ids=self.input_ids[cut],
                       attention_mask=None if self.attention_mask is None else self.attention_mask[cut],
                       labels=None if self.labels is None else self.labels[cut],
                       tokens=None if self.tokens is None else self.tokens[cut],
                       token_type_ids=None if self.token_type_ids is None else self.token_type_ids[cut],
                       wrong_labels=None if self.wrong_labels is None else self.wrong_labels[cut])


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a data file as a plain dict of tensors (loads with weights_only=True)."""
    plain = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return atomic_write(path, lambda f: torch.save(plain, f), what="data file")


def load_data(path: str | Path, *, tokenizer: Any = None, max_length: int | None = None,
              label2id: Mapping[str, int] | None = None, model_max_length: int | None = None) -> Any:
    """Read and validate a data file. Text files need `tokenizer` (a Hugging Face tokenizer).

    max_length truncates text when tokenising (default: the lower of model_max_length and the
    tokenizer's own limit); label2id maps label names in text files to ids.
    With a tokenizer, `tokens` holds each example's token strings. A file holding pixel_values
    gives an ImageSet (images and class labels, see _images.py) instead of a DataSet.
    """
    path = Path(path)
    require_file(path, "data file")
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        from ._text import read_text_data
        tensors, tokens = read_text_data(path, tokenizer=tokenizer, max_length=max_length, label2id=label2id,
                                         model_max_length=model_max_length)
        return validate(tensors, path, tokens=tokens)
    if suffix not in TENSOR_SUFFIXES:
        raise InputFileError(f"{path}: unknown data format {suffix or '(no suffix)'!r}; use .pt, .safetensors "
                             "or .npz tensors (input_ids, attention_mask, labels), .bin token ids (nanoGPT's), "
                             "or .jsonl/.csv text")
    from ._token_stream import is_token_stream, read_token_stream
    if is_token_stream(path):
        tensors = read_token_stream(path, max_length or model_max_length)
    else:
        tensors = _read_tensors(path)
    data = validate(tensors, path)
    if tokenizer is not None and isinstance(data, DataSet):
        data.tokens = token_strings(tokenizer, data.input_ids)
    return data


def load_data_for(model: Any, path: str | Path, *, tokenizer: Any = None, max_length: int | None = None) -> DataSet:
    """load_data for `model`, as the CLI commands read data: text through the model's tokenizer,
    label names through its config's label2id, truncated to its maximum positions.

    The tokenizer is `tokenizer` when given, else the one load_model attached to a Hugging Face
    folder; a model built in memory has none attached, so text data for it needs `tokenizer=`.
    max_length truncates text (default: the lower of the model's and the tokenizer's limits).
    """
    from ._model import label2id_of, max_positions_of, tokenizer_of

    return load_data(path, tokenizer=tokenizer if tokenizer is not None else tokenizer_of(model),
                     max_length=max_length, label2id=label2id_of(model), model_max_length=max_positions_of(model))


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputFileError(f"{path}: not a readable safetensors file ({one_line(exc)}); write it with "
                                 "safetensors.torch.save_file({'input_ids': ...}, path)") from None
    if suffix == ".npz":
        return _read_npz(path)
    obj = torch_load(path, what="data file", can_trust=False)
    if isinstance(obj, torch.Tensor):
        return {"input_ids": obj}  # a bare [N, T] tensor is the token ids
    if not isinstance(obj, Mapping):
        raise InputFileError(f"{path}: holds a {type(obj).__name__}, not a dict of tensors; save it with "
                             "torch.save({'input_ids': ids, 'attention_mask': mask, 'labels': labels}, path)")
    return dict(obj)


# Arrays in a data file are token ids and labels: a few GB at most. A limit keeps a hostile
# .npz (35 MB declaring 8 GB, a header declaring 10**12 elements) from being allocated at all.
MAX_DATA_BYTES = 4 << 30


def _read_npz(path: Path) -> dict[str, torch.Tensor]:
    import zipfile

    import numpy as np
    fix = "write it with numpy.savez(path, input_ids=ids, labels=labels)"
    _check_npz_sizes(path, fix)
    try:
        with np.load(path, allow_pickle=False) as npz:  # object arrays would need unpickling
            return {k: torch.from_numpy(np.array(npz[k])) for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputFileError(f"{path}: not a readable .npz of plain arrays ({one_line(exc)}); {fix}") from None
    except TypeError as exc:  # dtypes torch has no equivalent for (strings, ...)
        raise DataError(f"{path}: holds arrays torch cannot use ({one_line(exc)}); store integer arrays") from None


def _check_npz_sizes(path: Path, fix: str) -> None:
    """Compare each array's declared size with its stored size and MAX_DATA_BYTES before reading.

    Only the zip directory and each .npy header (a few hundred bytes) are read.
    """
    import zipfile

    import numpy as np
    from numpy.lib import format as npy

    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as f:
                    version = npy.read_magic(f)
                    if version not in ((1, 0), (2, 0), (3, 0)):
                        raise InputFileError(f"{path}: not a readable .npz of plain arrays (unknown .npy "
                                             f"version {version}); {fix}")
                    reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = reader(f, max_header_size=10_000)
                declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
                name = info.filename[:-4]
                if declared > info.file_size:
                    raise InputFileError(f"{path}: array {name!r} declares {declared:,} bytes {tuple(shape)} but "
                                         f"stores {info.file_size:,}; the file is damaged or hostile: {fix}")
                total += declared
                if total > MAX_DATA_BYTES:
                    raise InputFileError(f"{path}: arrays of over {MAX_DATA_BYTES:,} bytes ({name!r} declares "
                                         f"{tuple(shape)}); a data set this large is not read whole: use fewer "
                                         "examples, or split it into several files")
    except InputFileError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, TypeError) as exc:
        raise InputFileError(f"{path}: not a readable .npz of plain arrays ({one_line(exc)}); {fix}") from None


def _as_int64(name: str, value: Any, path: Path) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise DataError(f"{path}: {name} is a {type(value).__name__}, not a tensor; store it as a torch tensor")
    if value.dtype == torch.bool and name != "input_ids":
        return value.long()
    if value.dtype in _UINT_DTYPES:
        return value.to(torch.int64)  # every uint16 / uint32 value fits
    if value.dtype not in _INT_DTYPES:
        raise DataError(f"{path}: {name} has dtype {str(value.dtype).replace('torch.', '')}, but must hold "
                        f"integers; convert it with .long() before saving")
    return value.long()


def validate(tensors: Mapping[str, Any], path: str | Path, *, tokens: list[list[str]] | None = None) -> Any:
    """Check names, shapes, dtypes and values; return the DataSet (or, for pixel_values, the
    ImageSet: see _images.py) or raise DataError naming the fix."""
    path = Path(path)
    if "pixel_values" in tensors:
        from ._images import validate_images
        return validate_images(tensors, path)
    if "input_ids" not in tensors:
        found = ", ".join(sorted(map(str, tensors))) or "nothing"
        raise DataError(f"{path}: has no input_ids (found: {found}); store the token ids [N, T] as 'input_ids' "
                        "(or images [N, C, H, W] as 'pixel_values')")
    ids = _as_int64("input_ids", tensors["input_ids"], path)
    if ids.dim() != 2:
        raise DataError(f"{path}: input_ids has shape {tuple(ids.shape)}, but must be [N, T] (examples x "
                        "positions); add a batch dimension with ids.unsqueeze(0) for one example")
    N, T = ids.shape
    if N == 0 or T == 0:
        raise DataError(f"{path}: holds no examples (input_ids has shape {tuple(ids.shape)}); it needs at least "
                        "one example of at least one token")
    if bool((ids < 0).any()):
        raise DataError(f"{path}: input_ids holds negative ids (min {int(ids.min())}); token ids start at 0")
    mask = _mask(tensors, "attention_mask", path, (N, T))
    if mask is not None:
        empty = (mask.sum(1) == 0).nonzero().flatten()
        if len(empty):
            raise DataError(f"{path}: example {int(empty[0])} has no real tokens (its attention_mask is all 0); "
                            "drop empty examples")
    types = _mask(tensors, "token_type_ids", path, (N, T), binary=False)
    labels = None
    if tensors.get("labels") is not None:
        labels = _as_int64("labels", tensors["labels"], path)
        if tuple(labels.shape) not in ((N,), (N, T)):
            raise DataError(f"{path}: labels have shape {tuple(labels.shape)}, but must be [N] = ({N},) for "
                            f"sequence labels or [N, T] = ({N}, {T}) for token labels")
        bad = (labels < 0) & (labels != IGNORE)
        if bool(bad.any()):
            raise DataError(f"{path}: labels hold negative values other than {IGNORE} (e.g. "
                            f"{int(labels[bad][0])}); labels lie in [0, n_classes), {IGNORE} means 'not scored'")
        if not bool((labels != IGNORE).any()):
            raise DataError(f"{path}: every label is {IGNORE}, so nothing can be scored; store the real labels")
    if tokens is not None and len(tokens) != N:
        raise DataError(f"{path}: {len(tokens)} token lists for {N} examples")
    wrong = _wrong_labels(tensors, labels, path)
    return DataSet(ids, mask, labels, str(path), tokens, types, wrong)


def _wrong_labels(tensors: Mapping[str, Any], labels: torch.Tensor | None, path: Path) -> torch.Tensor | None:
    """wrong_labels: shaped like labels, a wrong answer (>= 0) or -100 per unit."""
    if tensors.get("wrong_labels") is None:
        return None
    wrong = _as_int64("wrong_labels", tensors["wrong_labels"], path)
    if labels is None or wrong.shape != labels.shape:
        raise DataError(f"{path}: wrong_labels have shape {tuple(wrong.shape)}, but must be shaped like labels "
                        f"{None if labels is None else tuple(labels.shape)}: the wrong answer where a label is "
                        f"scored, {IGNORE} elsewhere")
    bad = (wrong < 0) & (wrong != IGNORE)
    if bool(bad.any()):
        raise DataError(f"{path}: wrong_labels hold negative values other than {IGNORE} (e.g. {int(wrong[bad][0])}); "
                        "a wrong answer is a class or token id, {IGNORE} means 'none named'")
    return wrong


def _mask(tensors: Mapping[str, Any], name: str, path: Path, shape: tuple[int, int],
          binary: bool = True) -> torch.Tensor | None:
    if tensors.get(name) is None:
        return None
    value = _as_int64(name, tensors[name], path)
    if tuple(value.shape) != shape:
        raise DataError(f"{path}: {name} has shape {tuple(value.shape)}, but input_ids has {shape}; "
                        "they must match")
    if binary and not bool(((value == 0) | (value == 1)).all()):
        raise DataError(f"{path}: {name} holds values other than 0 and 1; use 1 for real tokens, 0 for padding")
    return value


def check_labels(data: DataSet, n_classes: int) -> None:
    """Raise DataError unless every scored label lies in [0, n_classes) (n_classes: model outputs)."""
    if data.labels is None:
        return
    scored = data.labels[data.labels != IGNORE]
    if len(scored) and int(scored.max()) >= n_classes:
        raise DataError(f"{data.source}: labels go up to {int(scored.max())}, but the model has {n_classes} "
                        f"outputs; labels must lie in [0, {n_classes}) -- is this the data for this model?")


def check_task(data: DataSet, task: str) -> None:
    """Raise DataError unless the task scores at least one position of `data` (LM data needs two
    real tokens in a row: with T = 1 nothing is predicted, and no statistic can be computed)."""
    from ..objectives import targets_for

    if getattr(data, "main_input", "input_ids") == "pixel_values":
        if task != "classification" or data.labels is None:
            raise DataError(f"{data.source}: images are scored as classification against labels [N]; store the "
                            "class ids as 'labels' (and use --task classification)")
        return
    targets = targets_for(task, data.inputs(), data.labels)
    if not bool((targets != IGNORE).any()):
        why = (f"every example has fewer than two real tokens (T = {data.seq_len})" if task == "lm"
               and data.labels is None else f"no label is scored for task {task!r}")
        raise DataError(f"{data.source}: nothing to score: {why}; language-model data needs at least two tokens "
                        "per example, classification data labels")


def check_vocab(data: DataSet, vocab_size: int) -> None:
    """Raise DataError unless every token id lies in [0, vocab_size)."""
    top = int(data.input_ids.max())
    if top >= vocab_size:
        raise DataError(f"{data.source}: input_ids go up to {top}, but the model's vocabulary has {vocab_size} "
                        "tokens; tokenise the data with this model's tokenizer")


def token_strings(tokenizer: Any, ids: torch.Tensor) -> list[list[str]]:
    """Token strings per example; ids the tokenizer does not know show as <id>."""
    out = []
    for row in ids.tolist():
        toks = tokenizer.convert_ids_to_tokens(row)
        out.append([t if isinstance(t, str) else f"<{i}>" for t, i in zip(toks, row)])
    return out
