"""The models people write themselves (tests/clients: nanoGPT, minGPT, x-transformers, timm and
torchvision ViTs) through the CLI, on the files their users hold, with no code beyond a factory:
each model's own module sits next to its checkpoint, as a user's model.py does."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli

from ..clients import mingpt, nanogpt, timm_vit, torchvision_vit, xtransformers
from ..clients.files import pixel_values, save_images, save_state_dict
from ..tolerance import approx

pytestmark = pytest.mark.numerics

CLIENTS = Path(__file__).resolve().parent.parent / "clients"
SIZE = dict(depth=2, width=32)  # every client model: 2 layers, width 32
_COUNTER = itertools.count()


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def own(tmp_path, monkeypatch):
    """own(client, factory_source) -> "module:build": the client's model file copied into a cwd of
    its own under a fresh name, and a factory module whose source names it as {model}."""
    monkeypatch.chdir(tmp_path)
    made: list[str] = []

    def make(client: str, source: str) -> str:
        n = next(_COUNTER)
        model, factory = f"{client}_model_{n}", f"{client}_factory_{n}"
        shutil.copy(CLIENTS / f"{client}.py", tmp_path / f"{model}.py")
        (tmp_path / f"{factory}.py").write_text(source.format(model=model))
        made.extend([model, factory])
        return f"{factory}:build"

    yield make
    for name in made:
        sys.modules.pop(name, None)


NANOGPT_FACTORY = """
from {model} import GPT, GPTConfig

def build(model_args):
    return GPT(GPTConfig(**model_args))
"""


def _val_bin(n_windows: int, block: int = 16) -> torch.Tensor:
    """A val.bin as nanoGPT's prepare.py writes it (raw uint16), a little longer than n_windows
    windows; returns the ids as diagnose cuts them, [n_windows, block] int64."""
    stream = torch.randint(0, 64, (n_windows * block + 5,), generator=torch.Generator().manual_seed(3))
    nanogpt.write_val_bin("val.bin", stream.tolist())
    return stream[:n_windows * block].view(n_windows, block)


def test_nanogpt_checkpoint_and_val_bin_run_through_info_heads_check_and_report(own):
    model = nanogpt.make()
    nanogpt.save_like_train_py(model, "ckpt.pt")  # compiled: '_orig_mod.' keys; {'model', 'model_args', ...}
    ids = _val_bin(40)
    args = ["ckpt.pt", "--factory", own("nanogpt", NANOGPT_FACTORY), "--data", "val.bin"]

    info = _run("info", *args)
    assert info.exit_code == 0, info.output
    assert "N=40  T=16" in info.stdout and "token ids 0..63" in info.stdout
    assert "[2, 1, 64]" in info.stdout and "last position only" in info.stdout
    assert "'_orig_mod.'" in info.stderr and info.stderr.startswith("note: ")

    heads = _run("heads", *args, "--json", "heads.json")
    assert heads.exit_code == 0, heads.output
    result = json.loads(Path("heads.json").read_text())
    assert result["task"] == "lm" and result["n_examples"] == 40 and result["n_units"] == 40
    assert len(result["heads"]) == 4  # 2 layers x 2 heads
    with torch.no_grad():  # nanoGPT's own forward: the last position's logits, after the first 15 tokens
        logits, _ = model(ids[:, :-1])  # [40, 1, 64]
    want = F.cross_entropy(logits[:, 0], ids[:, -1])
    assert result["baseline"]["loss"] == approx(float(want), **SIZE)
    assert "last position only" in heads.stderr

    check = _run("check", *args, "--causal", "--strict")
    assert check.exit_code == 0, check.output
    assert "passed: causal" in check.stdout

    report = _run("report", "heads.json", "-o", "report.html")
    assert report.exit_code == 0, report.output
    assert Path("report.html").stat().st_size > 0


def test_check_causal_strict_catches_nanogpt_with_its_mask_removed(own):
    model = nanogpt.make(flash=False)  # the hand-written softmax, masked by the `bias` buffer
    model.transformer.h[1].attn.bias.fill_(1.0)  # the mask gone: every position sees the future
    nanogpt.save_like_train_py(model, "ckpt.pt")
    _val_bin(8)
    factory = own("nanogpt", NANOGPT_FACTORY.replace("GPTConfig(**model_args)", "GPTConfig(**model_args, flash=False)"))
    check = _run("check", "ckpt.pt", "--factory", factory, "--data", "val.bin", "--causal", "--strict")
    assert check.exit_code == 1, check.output
    assert "Causal leak" in check.stdout


def test_a_model_that_cannot_be_called_is_one_line_naming_its_signature_and_forward_fixes_it(own):
    source = """
import torch.nn as nn
from {model} import GPT, GPTConfig, TINY

class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = GPT(GPTConfig(**TINY))

    def forward(self, tokens, scale):
        return self.gpt(tokens, tokens)[0] * scale

def build():
    return TwoInputs()

def call(model, inputs):
    return model(inputs["input_ids"], 1.0)
"""
    factory = own("nanogpt", source)
    torch.save({f"gpt.{k}": v for k, v in nanogpt.make().state_dict().items()}, "w.pt")
    torch.save({"input_ids": torch.randint(0, 64, (6, 8))}, "ids.pt")
    bad = _run("info", "w.pt", "--factory", factory, "--data", "ids.pt")
    assert bad.exit_code == 2 and bad.stdout.count("\n") <= 5, bad.output
    lines = bad.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in bad.output
    assert "TwoInputs.forward(tokens, scale)" in lines[0] and "--forward" in lines[0]
    good = _run("info", "w.pt", "--factory", factory, "--forward", factory.replace(":build", ":call"),
                "--data", "ids.pt")
    assert good.exit_code == 0, good.output
    assert "output      [2, 8, 64]" in good.stdout


def test_mingpt_state_dict_saved_under_ddp_runs_info_and_heads(own):
    model = mingpt.make()
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, "model.pt")  # DDP's model.state_dict()
    ids = torch.randint(0, 64, (24, 12), generator=torch.Generator().manual_seed(4))
    torch.save({"input_ids": ids.to(torch.int32)}, "ids.pt")
    args = ["model.pt", "--factory", own("mingpt", "from {model} import make\n\ndef build():\n    return make()\n"),
            "--data", "ids.pt"]
    info = _run("info", *args)
    assert info.exit_code == 0, info.output
    assert "output      [2, 12, 64]" in info.stdout and "'module.'" in info.stderr
    heads = _run("heads", *args, "--json", "heads.json")
    assert heads.exit_code == 0, heads.output
    result = json.loads(Path("heads.json").read_text())
    assert result["n_units"] == 24 * 11 and len(result["heads"]) == 4
    with torch.no_grad():  # minGPT's own loss with the inputs shifted by one as targets
        logits, _ = model(ids)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    assert result["baseline"]["loss"] == approx(float(want), **SIZE)


def test_x_transformers_uint32_npz_with_padding_runs_info(own):
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[::2, -3:] = 0
    np.savez("ids.npz", input_ids=ids.numpy().astype(np.uint32), attention_mask=mask.numpy())
    save_state_dict(xtransformers.make(), "model.pt")
    info = _run("info", "model.pt", "--factory", own("xtransformers", "from {model} import make\n\ndef build():\n"
                                                                        "    return make()\n"), "--data", "ids.npz")
    assert info.exit_code == 0, info.output
    assert f"token ids {int(ids.min())}..{int(ids.max())}" in info.stdout and "12.5% of positions" in info.stdout
    assert "output      [2, 12, 64]" in info.stdout


def test_uint16_ids_beyond_the_vocabulary_are_still_refused(own):
    nanogpt.save_like_train_py(nanogpt.make(), "ckpt.pt")
    ids = np.full((4, 16), 70, dtype=np.uint16)  # vocabulary 64
    np.savez("ids.npz", input_ids=ids)
    bad = _run("info", "ckpt.pt", "--factory", own("nanogpt", NANOGPT_FACTORY), "--data", "ids.npz")
    assert bad.exit_code == 2
    assert bad.stderr.splitlines() == [bad.stderr.strip()] and "ids.npz: input_ids go up to 70" in bad.stderr


@pytest.mark.parametrize("client", [timm_vit, torchvision_vit], ids=["timm", "torchvision"])
def test_vit_state_dict_and_pixel_values_run_info_and_heads(own, client):
    model = client.make()
    save_state_dict(model, "model.pt")
    images, labels = pixel_values(24), torch.arange(24) % 10
    save_images("images.pt", images, labels)
    name = client.__name__.rsplit(".", 1)[-1]
    args = ["model.pt", "--factory", own(name, "from {model} import make\n\ndef build():\n    return make()\n"),
            "--data", "images.pt"]
    info = _run("info", *args)
    assert info.exit_code == 0, info.output
    assert "N=24  images 3x16x16" in info.stdout and "output      [2, 10]" in info.stdout
    assert "class [24], 0..9" in info.stdout and "labels fit" in info.stdout
    heads = _run("heads", *args, "--json", "heads.json")
    assert heads.exit_code == 0, heads.output
    result = json.loads(Path("heads.json").read_text())
    assert result["task"] == "classification" and result["n_examples"] == 24 and len(result["heads"]) == 8
    with torch.no_grad():
        logits = model(images)  # [24, 10]
    assert result["baseline"]["loss"] == approx(float(F.cross_entropy(logits, labels)), **SIZE)
    assert result["baseline"]["accuracy"] == approx(float((logits.argmax(-1) == labels).float().mean()))


def test_image_data_without_pixel_floats_is_one_line(own):
    torch.save({"pixel_values": torch.zeros(2, 3, 16, 16, dtype=torch.uint8)}, "images.pt")
    save_state_dict(timm_vit.make(), "model.pt")
    bad = _run("info", "model.pt", "--factory", own("timm_vit", "from {model} import make\n\ndef build():\n"
                                                                "    return make()\n"), "--data", "images.pt")
    assert bad.exit_code == 2 and len(bad.stderr.splitlines()) == 1
    assert "images.pt: pixel_values is uint8, but must be a float tensor" in bad.stderr
