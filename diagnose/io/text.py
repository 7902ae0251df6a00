"""Text data: .jsonl (one object per line) or .csv (header row) with a `text` column, optional
`text_pair` and optional `label`, tokenised with the model's Hugging Face tokenizer.

Without a `label` column the data has no labels (language-model data: the targets are the
inputs shifted by one). Padding goes to the longest example, on the tokenizer's padding side.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import DataError, InputFileError

# A misnamed label column would silently turn classification data into unlabelled data.
_LABEL_LOOKALIKES = ("labels", "target", "targets", "class", "y", "category")
_MAX_SANE_LENGTH = 100_000  # tokenizers without a limit report model_max_length = 1e30


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` names the file and line for error messages."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        rows = []
        for i, row in enumerate(reader, start=2):  # line 1 is the header
            if None in row:
                raise DataError(f"{path}, line {i}: more fields than the header has columns; quote "
                                "text that contains commas")
            rows.append((f"{path}, line {i}", {k: v for k, v in row.items() if v is not None}))
        return rows
    rows = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {i}: not valid JSON ({exc.msg}); write one JSON object per line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}, line {i}: a JSON {type(obj).__name__}, not an object like "
                            '{"text": "...", "label": 0}')
        rows.append((f"{path}, line {i}", obj))
    return rows


def read_text_data(path: Path, *, tokenizer: Any, max_length: int | None = None,
                   label2id: Mapping[str, int] | None = None) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """Tensors (input_ids, attention_mask, labels, token_type_ids for pairs) and token strings."""
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path}: holds no examples; add rows with a 'text' column (and 'label')")
    columns = set().union(*(row.keys() for _, row in rows))
    if "text" not in columns:
        raise DataError(f"{path}: has no 'text' column (found: {', '.join(sorted(columns)) or 'nothing'}); "
                        "each example needs 'text', optionally 'text_pair' and 'label'")
    lookalike = [c for c in _LABEL_LOOKALIKES if c in columns]
    if "label" not in columns and lookalike:
        raise DataError(f"{path}: has a {lookalike[0]!r} column but no 'label' column; rename it to 'label'")
    if tokenizer is None:
        raise DataError(f"{path}: is text, and the model has no tokenizer to turn it into token ids; save one "
                        "into the model folder with tokenizer.save_pretrained(folder), or pass token ids as .pt")
    texts = [_field(row, "text", where) for where, row in rows]
    pairs = [_field(row, "text_pair", where) for where, row in rows] if "text_pair" in columns else None
    labels = [_label(_field(row, "label", where), label2id, where) for where, row in rows] \
        if "label" in columns else None
    limit = max_length
    if limit is None:
        model_max = getattr(tokenizer, "model_max_length", None)
        limit = model_max if isinstance(model_max, int) and model_max < _MAX_SANE_LENGTH else None
    kwargs = {"truncation": True, "max_length": limit} if limit else {}
    enc = tokenizer(texts, text_pair=pairs, **kwargs) if pairs is not None else tokenizer(texts, **kwargs)
    ids = [list(r) for r in enc["input_ids"]]
    for (where, _), row_ids in zip(rows, ids):
        if not row_ids:
            raise DataError(f"{where}: the text encodes to no tokens; drop empty examples")
    pad_id = next((i for i in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None))
                   if isinstance(i, int)), 0)
    left = getattr(tokenizer, "padding_side", "right") == "left"
    tensors = {"input_ids": _pad(ids, pad_id, left), "attention_mask": _pad([[1] * len(r) for r in ids], 0, left)}
    if pairs is not None and "token_type_ids" in enc:
        tensors["token_type_ids"] = _pad([list(r) for r in enc["token_type_ids"]], 0, left)
    if labels is not None:
        tensors["labels"] = torch.tensor(labels, dtype=torch.long)  # [N]
    from .data import token_strings
    return tensors, token_strings(tokenizer, tensors["input_ids"])


def _pad(rows: list[list[int]], value: int, left: bool) -> torch.Tensor:
    """[N, T] int64, T = the longest row."""
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), value, dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(T - len(r), T) if left else slice(0, len(r))
        out[i, cols] = torch.tensor(r, dtype=torch.long)
    return out


def _field(row: Mapping[str, Any], name: str, where: str) -> Any:
    value = row.get(name)
    if value is None or (isinstance(value, str) and name == "label" and not value.strip()):
        raise DataError(f"{where}: has no {name!r}; every example needs one once any example has one")
    if name != "label" and not isinstance(value, str):
        raise DataError(f"{where}: {name!r} is a {type(value).__name__}, not a string")
    if name == "text" and not value.strip():
        raise DataError(f"{where}: 'text' is empty; drop empty examples")
    return value


def _label(value: Any, label2id: Mapping[str, int] | None, where: str) -> int:
    """An integer class id; label names go through the model's label2id."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        name = value.strip()
        if label2id and name in label2id:
            return int(label2id[name])
        try:
            return int(name)
        except ValueError:
            pass
    known = f" or one of the model's label names ({', '.join(sorted(label2id)[:6])})" if label2id else ""
    raise DataError(f"{where}: label {value!r} is not an integer class id{known}; use integer labels")
