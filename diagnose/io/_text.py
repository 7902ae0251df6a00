"""Text data: .jsonl (one object per line) or .csv (header row) with a `text` column, optional
`text_pair` and optional `label`, tokenised with the model's Hugging Face tokenizer.

Without a `label` column the data has no labels (language-model data: the targets are the
inputs shifted by one). Padding goes to the longest example, on the tokenizer's padding side.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import DataError, InputFileError
from ._read import iter_lines, read_bytes

# A misnamed label column would silently turn classification data into unlabelled data.
_LABEL_LOOKALIKES = ("labels", "target", "targets", "class", "y", "category")
_MAX_SANE_LENGTH = 100_000  # tokenizers without a limit report model_max_length = 1e30
MAX_LINE_BYTES = 64 << 20  # one JSONL example; a longer line is refused before it is read whole
_MAX_CSV_BYTES = 1 << 30
# Text is cut to this many characters per allowed token before tokenising (a token is rarely
# longer), so a 50 MB example costs what max_length tokens cost; see _tokenise.
_CHARS_PER_TOKEN = 16
_LABEL_LIMIT = 1 << 31  # class ids beyond int32 mean a broken file, not a big classifier


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` names the file and line for error messages.

    JSONL is split on "\\n" only: U+2028 and the other characters str.splitlines() also splits
    at may stand inside a JSON string. No line may exceed MAX_LINE_BYTES.
    """
    if path.suffix.lower() == ".csv":
        text = _decode(read_bytes(path, "data file", limit=_MAX_CSV_BYTES), path)
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = []
        old_limit = csv.field_size_limit(MAX_LINE_BYTES)  # the default 128 KiB refuses long but valid texts
        try:
            for row in reader:
                i = reader.line_num
                if None in row:
                    raise DataError(f"{path}, line {i}: more fields than the header has columns; quote "
                                    "text that contains commas")
                rows.append((f"{path}, line {i}", {k: v for k, v in row.items() if v is not None}))
        except csv.Error as exc:
            raise DataError(f"{path}, line {reader.line_num}: not valid CSV ({exc}); write one example per row "
                            "under a header row") from None
        finally:
            csv.field_size_limit(old_limit)
        return rows
    rows = []
    for i, raw in iter_lines(path, "data file", max_line=MAX_LINE_BYTES):
        line = _decode(raw, path, i)
        if not line.strip():
            continue
        where = f"{path}, line {i}"
        try:
            obj = json.loads(line)
        except RecursionError:
            raise DataError(f"{where}: JSON nested too deeply; write one flat object per line") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg}); write one JSON object per line") from None
        except ValueError as exc:  # a number with more digits than int() accepts
            raise DataError(f"{where}: JSON that cannot be read ({str(exc)[:120]}); write one JSON object "
                            "per line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: a JSON {type(obj).__name__}, not an object like "
                            '{"text": "...", "label": 0}')
        rows.append((where, obj))
    return rows


def _decode(raw: bytes, path: Path, line: int | None = None) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{path}" if line is None else f"{path}, line {line}"
        raise InputFileError(f"{where}: is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") \
            from None
    return text[1:] if line in (None, 1) and text.startswith("\ufeff") else text


def read_text_data(path: Path, *, tokenizer: Any, max_length: int | None = None,
                   label2id: Mapping[str, int] | None = None, model_max_length: int | None = None) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
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
                        "into the model folder with tokenizer.save_pretrained(folder), pass it in Python "
                        "(diagnose.load_data_for(model, path, tokenizer=tok)), or pass token ids as .pt")
    texts = [_field(row, "text", where) for where, row in rows]
    pairs = [_field(row, "text_pair", where) for where, row in rows] if "text_pair" in columns else None
    labels = [_label(_field(row, "label", where), label2id, where) for where, row in rows] \
        if "label" in columns else None
    limit = max_length
    if limit is None:
        tok_max = getattr(tokenizer, "model_max_length", None)
        known = [n for n in (tok_max, model_max_length) if isinstance(n, int) and 0 < n < _MAX_SANE_LENGTH]
        limit = min(known) if known else _MAX_SANE_LENGTH
    enc = _tokenise(tokenizer, texts, pairs, limit)
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
    from ._data import token_strings
    return tensors, token_strings(tokenizer, tensors["input_ids"])


def _tokenise(tokenizer: Any, texts: list[str], pairs: list[str] | None, limit: int) -> Any:
    """The tokenizer's encoding truncated to `limit` tokens, without tokenising whole huge texts.

    Each text is first cut at a space at most limit * _CHARS_PER_TOKEN characters in, so a 50 MB
    line costs what `limit` tokens cost (the Rust tokenizer otherwise holds the whole line's
    tokens: gigabytes). Cut at a space, the words kept encode as they do in the whole text; a cut
    text that still gives `limit` tokens therefore gives the same first `limit` tokens. Rows whose
    cut text came out shorter (very long words) are encoded again whole. Text with no space in the
    second half of the cut (e.g. Chinese) is cut mid-word; that word could only matter if the first
    `limit` tokens took more than _CHARS_PER_TOKEN / 2 characters each.
    """
    cap = limit * _CHARS_PER_TOKEN
    cut_texts = [_cut(t, cap) for t in texts]
    cut_pairs = None if pairs is None else [_cut(t, cap) for t in pairs]
    kwargs = {"truncation": True, "max_length": limit}

    def encode(a: list[str], b: list[str] | None) -> Any:
        return tokenizer(a, text_pair=b, **kwargs) if b is not None else tokenizer(a, **kwargs)

    enc = encode(cut_texts, cut_pairs)
    redo = [i for i, row in enumerate(enc["input_ids"]) if len(row) < limit and
            (cut_texts[i] is not texts[i] or (pairs is not None and cut_pairs[i] is not pairs[i]))]
    if redo:
        again = encode([texts[i] for i in redo], None if pairs is None else [pairs[i] for i in redo])
        for key in enc.keys():
            for j, i in enumerate(redo):
                enc[key][i] = again[key][j]
    return enc


def _cut(text: str, cap: int) -> str:
    """`text` itself when short enough, else its first `cap` characters, cut back to a space."""
    if len(text) <= cap:
        return text
    head = text[:cap]
    space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return head[:space] if space > cap // 2 else head


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
    if name != "label":
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON allows "\ud800"; no tokenizer takes it
            raise DataError(f"{where}: {name!r} holds a lone surrogate ({value[exc.start]!r}), which is not "
                            "text; write the characters themselves, or drop them") from None
    return value


def _label(value: Any, label2id: Mapping[str, int] | None, where: str) -> int:
    """An integer class id; label names go through the model's label2id."""
    out = None
    if isinstance(value, bool):
        out = int(value)
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        name = value.strip()
        if label2id and name in label2id:
            out = label2id[name]
        else:
            try:
                out = int(name) if len(name) < 20 else None
            except ValueError:
                pass
    if isinstance(out, int) and not -_LABEL_LIMIT < out < _LABEL_LIMIT:
        raise DataError(f"{where}: label {_short_repr(value)} is far beyond any class id; labels are class "
                        "indices 0, 1, 2, ... (or -100 for 'not scored')")
    if isinstance(out, int):
        return int(out)
    known = f" or one of the model's label names ({', '.join(sorted(label2id)[:6])})" if label2id else ""
    raise DataError(f"{where}: label {_short_repr(value)} is not an integer class id{known}; use integer labels")


def _short_repr(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"~1e{len(str(abs(value))) - 1}"
    return text if len(text) <= 60 else text[:57] + "..."
