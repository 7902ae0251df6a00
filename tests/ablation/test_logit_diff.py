"""The logit difference (label - named wrong answer, Wang et al. 2022's IOI metric) per head: against the
same model with that head's output-projection slice zeroed, and through the CLI on a saved data file."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from diagnose import ablate_heads, save_checkpoint
from diagnose.cli.main import cli

from .helpers import with_head_weights_zeroed
from ..tolerance import approx, size_of

pytestmark = pytest.mark.numerics

V, T, N, H, D = 20, 7, 10, 4, 8


def _task(data):
    """Labels at positions 3 and 6 only (the next token there), a wrong answer at 3 alone, -100 elsewhere."""
    ids = data["input_ids"]
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 4]
    labels[1::2, 5] = ids[1::2, 6]  # the unpadded examples: a second scored unit without a wrong answer
    wrong = torch.full_like(ids, -100)
    wrong[:, 3] = (ids[:, 4] + 7) % V
    return {"input_ids": ids, "labels": labels, "wrong_labels": wrong}


def _diff(model, task) -> float:
    """Mean over the units with a wrong answer of logit[label] - logit[wrong], by plain forwards."""
    with torch.no_grad():
        logits = model(input_ids=task["input_ids"])  # [N, T, V]
    both = (task["labels"] != -100) & (task["wrong_labels"] != -100)
    pick = lambda t: logits[both].gather(1, t[both][:, None])[:, 0]  # noqa: E731
    return float((pick(task["labels"]) - pick(task["wrong_labels"])).mean())


def test_delta_logit_diff_is_the_zeroed_projection_slice(model, data):
    task = _task(data)
    result = ablate_heads(model, task, task="lm", progress=False, attention=False, direct=False)
    clean = _diff(model, task)
    assert result.baseline["logit_diff"] == approx(clean, **size_of(model))
    for layer, head in [(0, 1), (1, 2)]:
        ablated = with_head_weights_zeroed(model.blocks[layer].attn.proj.weight, 1, head, D, lambda: _diff(model, task))
        got = result.head(layer, head)
        assert got.logit_diff == approx(ablated, **size_of(model))
        assert got.delta_logit_diff == approx(ablated - clean, scale=abs(clean) + 1, **size_of(model))
        lo, hi = got.delta_logit_diff_ci
        assert lo <= got.delta_logit_diff <= hi
    assert all(h.delta_logit_diff is not None for h in result.heads)


def test_without_wrong_answers_there_is_no_logit_diff(model, data):
    task = _task(data)
    del task["wrong_labels"]
    result = ablate_heads(model, task, task="lm", progress=False, attention=False, direct=False)
    assert "logit_diff" not in result.baseline
    assert all(h.delta_logit_diff is None and h.delta_logit_diff_ci is None for h in result.heads)


def test_the_cli_prints_and_writes_it(model, data, tmp_path):
    save_checkpoint(model, tmp_path / "m.pt")
    torch.save(_task(data), tmp_path / "d.pt")
    result = CliRunner().invoke(cli, ["heads", str(tmp_path / "m.pt"), "--data", str(tmp_path / "d.pt"), "--no-direct",
                                      "--json", str(tmp_path / "h.json")])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    doc = json.loads((tmp_path / "h.json").read_text())
    assert f"logit diff {doc['baseline']['logit_diff']:.3f} (label - wrong answer)" in out
    assert "Δlogit" in out  # the column (its header wraps)
    assert all(len(h["delta_logit_diff_ci"]) == 2 for h in doc["heads"])


def test_wrong_labels_shaped_unlike_labels_are_refused(model, data, tmp_path):
    save_checkpoint(model, tmp_path / "m.pt")
    task = _task(data)
    task["wrong_labels"] = task["wrong_labels"][:, :3]
    torch.save(task, tmp_path / "d.pt")
    result = CliRunner().invoke(cli, ["heads", str(tmp_path / "m.pt"), "--data", str(tmp_path / "d.pt")])
    assert result.exit_code == 2
    assert "wrong_labels have shape (10, 3), but must be shaped like labels" in " ".join(result.output.split())
