"""Every data format loads into the same DataSet; every bad file is refused with the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import diagnose
from diagnose.errors import DataError, InputFileError
from diagnose.io import load_data_for
from diagnose.io._data import check_labels, check_vocab

pytestmark = pytest.mark.numerics


def _example(N: int = 5, T: int = 6, token_labels: bool = False) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 14, (N, T))  # [N, T]
    mask = torch.ones(N, T, dtype=torch.long)  # [N, T]
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    labels = torch.randint(0, 3, (N, T) if token_labels else (N,))  # [N] or [N, T]
    if token_labels:
        labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _write(fmt: str, tensors: dict[str, torch.Tensor], path):
    if fmt == "pt":
        torch.save(tensors, path)
    elif fmt == "safetensors":
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    else:
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})
    return path


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "npz"])
@pytest.mark.parametrize("token_labels", [False, True])
def test_tensor_formats_round_trip(tmp_path, fmt, token_labels):
    tensors = _example(token_labels=token_labels)
    data = diagnose.load_data(_write(fmt, tensors, tmp_path / f"d.{fmt}"))
    assert isinstance(data, diagnose.DataSet) and len(data) == 5 and data.seq_len == 6
    assert data.source == str(tmp_path / f"d.{fmt}") and data.tokens is None
    for name in ("input_ids", "attention_mask", "labels"):
        got = getattr(data, name)
        assert got.dtype == torch.int64 and torch.equal(got, tensors[name])


def test_narrow_integer_and_bool_dtypes_become_int64(tmp_path):
    t = _example()
    data = diagnose.load_data(_write("npz", {"input_ids": t["input_ids"].int(), "attention_mask":
                                             t["attention_mask"].bool(), "labels": t["labels"].to(torch.uint8)},
                                     tmp_path / "d.npz"))
    assert data.input_ids.dtype == data.attention_mask.dtype == data.labels.dtype == torch.int64
    assert torch.equal(data.attention_mask, t["attention_mask"])


def test_bare_tensor_is_input_ids_and_tokens_come_from_the_tokenizer(tmp_path, tokenizer):
    ids = torch.tensor([[2, 4, 5, 3], [2, 6, 99, 0]])  # [N, T]; 99 is outside the vocabulary
    torch.save(ids, tmp_path / "ids.pt")
    data = diagnose.load_data(tmp_path / "ids.pt", tokenizer=tokenizer)
    assert data.attention_mask is None and data.labels is None
    assert data.tokens == [["[CLS]", "the", "cat", "[SEP]"], ["[CLS]", "sat", "<99>", "[PAD]"]]


def test_batches_cover_the_data_in_order(tmp_path):
    tensors = _example(N=7)
    data = diagnose.load_data(_write("pt", tensors, tmp_path / "d.pt"))
    got = list(data.batches(3))
    assert [len(lab) for _, lab in got] == [3, 3, 1]
    assert all(set(inp) == {"input_ids", "attention_mask"} for inp, _ in got)
    assert torch.equal(torch.cat([inp["input_ids"] for inp, _ in got]), tensors["input_ids"])
    assert torch.equal(torch.cat([inp["attention_mask"] for inp, _ in got]), tensors["attention_mask"])
    assert torch.equal(torch.cat([lab for _, lab in got]), tensors["labels"])
    small = data.take(2)
    assert len(small) == 2 and torch.equal(small.labels, tensors["labels"][:2])
    torch.save({"input_ids": tensors["input_ids"]}, tmp_path / "ids.pt")
    (inp, lab), = diagnose.load_data(tmp_path / "ids.pt").batches(100)
    assert lab is None and set(inp) == {"input_ids"}


def test_jsonl_text_is_tokenised_like_the_tokenizer_does(tmp_path, tokenizer):
    rows = [{"text": "the cat sat", "label": 1}, {"text": "a dog", "label": 0, "id": 7},
            {"text": "the big red dog ran", "label": 2}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    data = diagnose.load_data(tmp_path / "d.jsonl", tokenizer=tokenizer)
    expected = [tokenizer(r["text"])["input_ids"] for r in rows]
    T = max(map(len, expected))
    assert data.input_ids.shape == (3, T) == data.attention_mask.shape
    for i, ids in enumerate(expected):  # right padding with the pad id
        assert data.input_ids[i].tolist() == ids + [tokenizer.pad_token_id] * (T - len(ids))
        assert data.attention_mask[i].tolist() == [1] * len(ids) + [0] * (T - len(ids))
    assert data.labels.tolist() == [1, 0, 2] and data.token_type_ids is None
    assert data.tokens[1] == ["[CLS]", "a", "dog", "[SEP]"] + ["[PAD]"] * (T - 4)


def test_csv_pairs_label_names_and_truncation(tmp_path, bert_folder):
    folder, _ = bert_folder
    model = diagnose.load_model(folder)
    (tmp_path / "d.csv").write_text('text,text_pair,label\n"the cat, the dog",sat on a mat,pos\n'
                                    "a dog,ran,0\nthe mat,red,neutral\n")
    data = load_data_for(model, tmp_path / "d.csv")
    assert data.labels.tolist() == [2, 0, 1]  # names through model.config.label2id, "0" as an integer
    tok = model.diagnose_tokenizer
    first = tok("the cat, the dog", text_pair="sat on a mat")
    assert data.input_ids[0].tolist() == first["input_ids"]
    assert data.token_type_ids[0].tolist() == first["token_type_ids"] == [0] * 7 + [1] * 5
    assert set(next(data.batches(2))[0]) == {"input_ids", "attention_mask", "token_type_ids"}
    with torch.no_grad():  # the batches feed the model as keyword arguments
        assert model(**next(data.batches(3))[0]).logits.shape == (3, 3)
    short = load_data_for(model, tmp_path / "d.csv", max_length=4)
    assert short.seq_len == 4 and short.input_ids[0].tolist() == tok("the cat, the dog", text_pair="sat on a mat",
                                                                    truncation=True, max_length=4)["input_ids"]


def test_text_without_label_column_is_lm_data(tmp_path, tokenizer):
    (tmp_path / "d.jsonl").write_text('{"text": "the cat"}\n{"text": "a dog ran"}\n')
    data = diagnose.load_data(tmp_path / "d.jsonl", tokenizer=tokenizer)
    assert data.labels is None and data.attention_mask.sum().item() == 4 + 5


def test_check_labels_and_vocab(tmp_path):
    data = diagnose.load_data(_write("pt", _example(token_labels=True), tmp_path / "d.pt"))
    check_labels(data, 3)  # labels lie in [0, 3)
    with pytest.raises(DataError, match=r"d.pt: labels go up to 2, but the model has 2 outputs"):
        check_labels(data, 2)
    check_vocab(data, int(data.input_ids.max()) + 1)
    with pytest.raises(DataError, match="vocabulary"):
        check_vocab(data, int(data.input_ids.max()))


def _pt(**tensors):
    return lambda p: torch.save(tensors, p)


IDS = torch.tensor([[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("name,make,exc,pattern", [
    ("d.pt", None, InputFileError, "no such file"),
    ("d.txt", lambda p: p.write_text("x"), InputFileError, "unknown data format '.txt'"),
    ("d.pt", lambda p: p.write_bytes(b"junk"), InputFileError, "not a file torch.load can read"),
    ("d.pt", lambda p: torch.save([IDS], p), InputFileError, "holds a list, not a dict of tensors"),
    ("d.pt", lambda p: torch.save({"x": np.zeros(2)}, p), InputFileError, "refuses it"),
    ("d.npz", lambda p: p.write_bytes(b"junk"), InputFileError, "not a readable .npz"),
    ("d.npz", lambda p: np.savez(p, input_ids=np.array([[{}]], dtype=object)), InputFileError, "not a readable"),
    ("d.safetensors", lambda p: p.write_bytes(b"junk"), InputFileError, "not a readable safetensors"),
    ("d.pt", _pt(ids=IDS), DataError, r"no input_ids \(found: ids\)"),
    ("d.pt", _pt(input_ids=IDS[0]), DataError, r"shape \(3,\), but must be \[N, T\]"),
    ("d.pt", _pt(input_ids=IDS.float()), DataError, "dtype float32.*integers"),
    ("d.pt", _pt(input_ids=torch.zeros(0, 3, dtype=torch.long)), DataError, "holds no examples"),
    ("d.pt", _pt(input_ids=-IDS), DataError, "negative ids"),
    ("d.pt", _pt(input_ids=IDS, attention_mask=torch.ones(2, 2, dtype=torch.long)), DataError, r"attention_mask has shape \(2, 2\)"),
    ("d.pt", _pt(input_ids=IDS, attention_mask=IDS), DataError, "other than 0 and 1"),
    ("d.pt", _pt(input_ids=IDS, attention_mask=torch.tensor([[1, 1, 0], [0, 0, 0]])), DataError,
     "example 1 has no real tokens"),
    ("d.pt", _pt(input_ids=IDS, labels=torch.zeros(3, dtype=torch.long)), DataError, r"labels have shape \(3,\)"),
    ("d.pt", _pt(input_ids=IDS, labels=torch.tensor([0.0, 1.0])), DataError, "labels has dtype float32"),
    ("d.pt", _pt(input_ids=IDS, labels=torch.tensor([0, -3])), DataError, "negative values other than -100"),
    ("d.pt", _pt(input_ids=IDS, labels=torch.full((2, 3), -100)), DataError, "every label is -100"),
    ("d.jsonl", lambda p: p.write_text(""), DataError, "holds no examples"),
    ("d.jsonl", lambda p: p.write_text('{"text": "a"}\n{oops\n'), DataError, "line 2: not valid JSON"),
    ("d.jsonl", lambda p: p.write_text('["a", 1]\n'), DataError, "line 1: a JSON list"),
    ("d.jsonl", lambda p: p.write_text('{"sentence": "a", "label": 1}\n'), DataError, "no 'text' column"),
    ("d.jsonl", lambda p: p.write_text('{"text": "a", "labels": 1}\n'), DataError, "rename it to 'label'"),
    ("d.jsonl", lambda p: p.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n'), DataError,
     "line 2: has no 'label'"),
    ("d.jsonl", lambda p: p.write_text('{"text": "a", "label": "happy"}\n'), DataError,
     "label 'happy' is not an integer"),
    ("d.jsonl", lambda p: p.write_text('{"text": " ", "label": 1}\n'), DataError, "line 1: 'text' is empty"),
    ("d.csv", lambda p: p.write_text("text,label\n"), DataError, "holds no examples"),
    ("d.csv", lambda p: p.write_text("text,label\na,1,extra\n"), DataError, "line 2: more fields"),
    ("d.csv", lambda p: p.write_bytes(b"text,label\n\xff\xfe,1\n"), InputFileError, "not UTF-8"),
])
def test_bad_data_files(tmp_path, tokenizer, name, make, exc, pattern):
    path = tmp_path / name
    if make is not None:
        make(path)
    with pytest.raises(exc, match=pattern) as info:
        diagnose.load_data(path, tokenizer=tokenizer)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_text_without_tokenizer(tmp_path):
    (tmp_path / "d.csv").write_text("text,label\nthe cat,1\n")
    with pytest.raises(DataError, match=r"d.csv: is text.*tokenizer.save_pretrained\(folder\).*as .pt"):
        diagnose.load_data(tmp_path / "d.csv")
