"""diagnose.io._read: regular files only, bounded sizes, JSONL split on "\\n" only."""

from __future__ import annotations

import os

import pytest

from diagnose.errors import InputFileError
from diagnose.io._read import iter_lines, parse_json, read_bytes, require_file, special_kind


def test_require_file_names_what_the_path_is(tmp_path):
    (tmp_path / "f").write_text("x")
    require_file(tmp_path / "f", "data file")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name, words in (("fifo", "named pipe"), ("zero", "character device"), ("missing", "no such file"),
                        ("dangling", "no such file"), ("", "is a folder")):
        with pytest.raises(InputFileError, match=words):
            require_file(tmp_path / name, "data file")
    assert special_kind(tmp_path / "fifo") == "a named pipe (FIFO)"
    assert special_kind(tmp_path / "f") is None and special_kind(tmp_path) is None


def test_iter_lines_splits_on_newline_only(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes('{"t": "a\u2028b\u0085c\x0cd"}\r\n\n{"t": 2}'.encode())
    lines = list(iter_lines(path, "data file"))
    assert [n for n, _ in lines] == [1, 2, 3]
    assert lines[0][1].decode() == '{"t": "a\u2028b\u0085c\x0cd"}' and lines[2][1] == b'{"t": 2}'


def test_iter_lines_refuses_a_long_line_without_holding_it(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"x" * 10 + b"\n" + b"y" * 11 + b"\n")
    assert list(iter_lines(path, "f", max_line=11))[0] == (1, b"x" * 10)
    with pytest.raises(InputFileError, match="line 2: longer than 10 bytes"):
        list(iter_lines(path, "f", max_line=10))
    path.write_bytes(b"x" * 10)  # exactly at the cap, no final newline
    assert list(iter_lines(path, "f", max_line=10)) == [(1, b"x" * 10)]


def test_read_bytes_limit_and_parse_json_depth(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[1, 2, 3]")
    assert read_bytes(path, "heads JSON", limit=9) == b"[1, 2, 3]"
    with pytest.raises(InputFileError, match="is 9 bytes, over the 8"):
        read_bytes(path, "heads JSON", limit=8)
    with pytest.raises(InputFileError, match="nested too deeply to read; fix it"):
        parse_json("[" * 100_000 + "]" * 100_000, "x.json", "fix it")
    with pytest.raises(InputFileError, match="not valid JSON .* line 1, column 2"):
        parse_json("{", "x.json", "fix it")
    nan, inf = parse_json("[NaN, Infinity]", "old.json", "")  # older files' bare tokens still read
    assert nan != nan and inf == float("inf")
