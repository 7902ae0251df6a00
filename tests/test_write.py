"""The one atomic write and the output guards (diagnose/_write.py)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from diagnose._write import atomic_write, check_output, check_outputs
from diagnose.errors import OutputError


def test_writes_whole_with_fsync_of_file_and_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr("diagnose._write.os.fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)),
                                                                real(fd)))
    p = atomic_write(tmp_path / "sub" / "a.json", "{}")
    assert p.read_text() == "{}" and synced == [False, True]  # the file, then its folder
    atomic_write(p, b"[1]")
    assert p.read_bytes() == b"[1]" and sorted(os.listdir(p.parent)) == ["a.json"]
    mode = stat.S_IMODE(os.stat(p).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # an ordinary file, not mkstemp's private 0600


def test_unique_temporary_names_survive_leftovers(tmp_path):
    (tmp_path / "a.json.partial").mkdir()
    (tmp_path / ".a.json.tmp").mkdir()
    atomic_write(tmp_path / "a.json", "x")
    assert (tmp_path / "a.json").read_text() == "x"


def test_writer_function_failure_leaves_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "m.pt"
    p.write_bytes(b"old")

    calls = []

    def full_once(f):  # the target's disk is full; the temporary folder is not
        calls.append(1)
        f.write(b"half" if len(calls) == 1 else b"whole")
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OutputError, match="No space left on device.*saved to .* instead.*free some space") as e:
        atomic_write(p, full_once)
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.pt"]
    saved = Path(str(e.value).split("saved to ")[1].split(" instead")[0])
    assert saved.read_bytes() == b"whole"
    saved.unlink()

    def always_full(f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OutputError, match="could not be saved in .* either"):
        atomic_write(p, always_full)
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.pt"]


def test_failure_without_fallback_says_nothing_was_kept(tmp_path, monkeypatch):
    monkeypatch.setattr("diagnose._write._write_replace",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.EROFS, os.strerror(errno.EROFS))))
    with pytest.raises(OutputError) as e:
        atomic_write(tmp_path / "run.json", "{}", keep_on_failure=False, what="run.json")
    assert "saved to" not in str(e.value) and "choose a folder you can write to" in str(e.value)


def test_fallback_holds_the_content(tmp_path, monkeypatch):
    monkeypatch.setattr("diagnose._write._write_replace",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.ENAMETOOLONG, "File name too long")))
    with pytest.raises(OutputError) as e:
        atomic_write(tmp_path / "r.html", "<html>")
    saved = Path(str(e.value).split("saved to ")[1].split(" instead")[0])
    try:
        assert saved.read_text() == "<html>" and saved.suffix == ".html" and "shorter file name" in str(e.value)
    finally:
        saved.unlink()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "a folder"),
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: (p.write_text("x"), p.chmod(0o444)), "read-only"),
])
def test_check_output_refuses(tmp_path, make, words):
    p = tmp_path / "out"
    make(p)
    with pytest.raises(OutputError, match=words):
        check_output(p)


def test_check_outputs_inputs_folders_and_duplicates(tmp_path):
    src = tmp_path / "in.pt"
    src.write_bytes(b"x")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(OutputError, match="input of this command"):
        check_outputs({"--json": tmp_path / "." / "in.pt"}, inputs=[src])
    with pytest.raises(OutputError, match="inside the input folder"):
        check_outputs({"-o": run / "deep" / "x.html"}, inputs=[run])
    with pytest.raises(OutputError, match="same file"):
        check_outputs({"--json": tmp_path / "o", "--html": tmp_path / "o"})
    check_outputs({"--json": tmp_path / "new.json", "--html": None}, inputs=[src, run, None, tmp_path / "missing"])
