"""Builders of hostile and broken inputs for the tests/cli/test_hostile_*.py files: model folders
that ship their own code, malicious pickles, special files, .npz bombs, damaged run folders; and
the two helpers they share: invoke (the CLI in-process) and assert_refused (the one-line error)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
import report_fixtures as rf  # noqa: E402


def invoke(*args, input=None):
    """The CLI run in-process with `args` (any of them a Path)."""
    from diagnose.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def assert_refused(res, *names: str, fix: str | None = None) -> str:
    """Exit 2, one `error:` line on stderr naming every one of `names` (and `fix`), no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    if fix is not None:
        assert fix in lines[0], (fix, lines[0])
    return lines[0]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


OWN_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PretrainedConfig, PreTrainedModel

class EvilConfig(PretrainedConfig):
    model_type = "evilnet"

class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def own_code_folder(tmp_path: Path, model_type: str = "evilnet", base: Path | None = None) -> tuple[Path, Path]:
    """(folder, marker): a model folder whose .py files write `marker` if anything imports them."""
    folder = tmp_path / "remote"
    folder.mkdir()
    marker = tmp_path / "MARKER"
    if base is not None:  # a real folder of a built-in family, with an auto_map added
        for p in base.iterdir():
            (folder / p.name).write_bytes(p.read_bytes())
        config = json.loads((folder / "config.json").read_text())
    else:
        config = {"architectures": ["EvilModel"], "hidden_size": 8}
        (folder / "model.safetensors").write_bytes(b"{}")
    config.update(model_type=model_type, architectures=["EvilModel"],
                  auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
                            "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(OWN_CODE.format(marker=str(marker)))
    if (folder / "tokenizer_config.json").exists():
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        tok["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
        (folder / "tokenization_evil.py").write_text(OWN_CODE.format(marker=str(marker)))
    return folder, marker


class Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickles(tmp_path: Path) -> dict[str, Path]:
    marker = tmp_path / "PWNED"
    out = {"zip": tmp_path / "evil-zip.pt", "raw": tmp_path / "evil-raw.pt", "proto0": tmp_path / "evil-p0.pt"}
    torch.save({"w": Evil(marker)}, out["zip"])
    import pickle

    out["raw"].write_bytes(pickle.dumps({"w": Evil(marker)}, protocol=4))
    out["proto0"].write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    return out


def special(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    return path


def npz_bomb(path: Path, shape: tuple[int, ...], payload: int) -> Path:
    import io
    import zipfile

    from numpy.lib import format as npy

    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("input_ids.npy", buf.getvalue() + b"\0" * payload)
    return path


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


FACTORY_EMB = """
import torch.nn as nn

class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None):
        x = self.emb(input_ids)
        x, _ = self.attn(x, x, x)
        return self.out(x.mean(1))

def build():
    return Bag()
"""


def run_folder(tmp: Path, edit) -> Path:
    run = rf.write_run(tmp / "run", steps=20, attention_every=5)
    edit(run)
    return run


def edit_info(**changes):
    def edit(run: Path):
        info = json.loads((run / "run.json").read_text())
        info.update(changes)
        (run / "run.json").write_text(json.dumps(info))
    return edit


def edit_record(i: int, **changes):
    def edit(run: Path):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        rec = json.loads(lines[i])
        for key, value in changes.items():
            if key == "entropy":
                next(iter(rec["attention"].values()))["entropy"] = value
            else:
                rec[key] = value
        lines[i] = json.dumps(rec)
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return edit


def special_in_run(name: str, kind: str):
    def edit(run: Path):
        (run / name).unlink()
        special(run, kind, name)
    return edit
