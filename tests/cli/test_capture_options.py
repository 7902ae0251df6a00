"""The shared --attention-module / --heads options reach find_heads unchanged."""

from __future__ import annotations

import click
import torch.nn as nn
from click.testing import CliRunner

import diagnose
from diagnose.cli._options import attention_options


def test_attention_options_name_modules():
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    seen = {}

    @click.command()
    @attention_options
    def cmd(attention_module, n_heads):
        sites = diagnose.find_heads(Mixer(), attention_module=attention_module, n_heads=n_heads)
        seen["sites"] = [(s.name, s.n_heads, s.head_dim) for s in sites]

    res = CliRunner().invoke(cmd, ["--attention-module", "blocks.*", "--heads", "2"])
    assert res.exit_code == 0, res.output
    assert seen["sites"] == [("blocks.0", 2, 4), ("blocks.1", 2, 4)]
    assert "--attention-module" in CliRunner().invoke(cmd, ["--help"]).output
    assert CliRunner().invoke(cmd, ["--heads", "0"]).exit_code == 2
