"""The shared --attention-module / --heads options reach find_heads unchanged."""

from __future__ import annotations

import click
from click.testing import CliRunner

import diagnose
from diagnose.cli._options import attention_options

from ..nano import nanogpt


def test_attention_options_name_modules():
    seen = {}

    @click.command()
    @attention_options
    def cmd(attention_module, n_heads):
        sites = diagnose.find_heads(nanogpt(False), attention_module=attention_module, n_heads=n_heads)
        seen["sites"] = [(s.name, s.n_heads, s.head_dim) for s in sites]

    for name in ("h.*.attn", "NanoAttention", r"re:h\.\d+\.attn"):
        res = CliRunner().invoke(cmd, ["--attention-module", name, "--heads", "3"])
        assert res.exit_code == 0, res.output
        assert seen.pop("sites") == [("h.0.attn", 3, 8), ("h.1.attn", 3, 8)]
    assert "--attention-module" in CliRunner().invoke(cmd, ["--help"]).output
    assert CliRunner().invoke(cmd, ["--heads", "0"]).exit_code == 2
