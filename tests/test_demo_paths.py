"""make demo-paths' WIRING groups (.ci/demo_paths.py): on a path other than the first, the lesson pair
is not trained again but read back from the first path's weights and run, the same model exactly."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from diagnose.demo import _lessons
from diagnose.zoo import ModelConfig, Transformer
from diagnose.zoo.train import evaluate

from .tolerance import assert_exact

pytestmark = pytest.mark.numerics

ROOT = Path(__file__).resolve().parents[1]


def test_a_wiring_pair_on_another_path_is_the_first_path_s_model_and_run(tmp_path):
    spec = importlib.util.spec_from_file_location("demo_paths", ROOT / ".ci" / "demo_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tiny = ModelConfig(kind="lm", vocab_size=24, max_len=32, n_layers=1, n_heads=2, d_model=16)
    v = replace(_lessons.variants(quick=True)["scaled"], model=tiny)
    source = tmp_path / "avx2" / "lessons-scaling"
    model = Transformer(tiny).eval()  # as the first path's job leaves it: weights/<name>.pt and runs/<name>
    (source / "weights").mkdir(parents=True)
    torch.save(model.state_dict(), source / "weights" / f"{v.name}.pt")
    (source / "runs" / v.name).mkdir(parents=True)
    (source / "runs" / v.name / "run.json").write_text(json.dumps({"closed": True}))
    cache: dict = {}
    got = module._trained_elsewhere(source, v, tmp_path / "default" / "runs", cache)
    assert got.variant == v and not got.model.training
    for (name, a), (_, b) in zip(got.model.state_dict().items(), model.state_dict().items(), strict=True):
        assert_exact(a, b)
    assert json.loads((got.run_dir / "run.json").read_text()) == {"closed": True}
    assert got.run_dir == tmp_path / "default" / "runs" / v.name
    loss, accuracy = evaluate(model, got.eval_data)  # measured here, on the eval split the lesson uses
    assert_exact(torch.tensor([got.loss, got.accuracy], dtype=torch.float64),
                 torch.tensor([loss, accuracy], dtype=torch.float64))
