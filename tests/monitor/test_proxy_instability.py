"""End to end on the small-scale proxy of bench/bench_proxies.py: at a high lr on real text,
attention_logit_growth fires without qk-layernorm and stays quiet with it (margins, not one
CPU's rounding: the logits reach the thousands without qk-norm and stay in the tens with it), also
over 600 steps at lr 0.3, where the qk-normed logits drift up (about 26x) but do not run away."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics

_spec = importlib.util.spec_from_file_location("_proxy", Path(__file__).parents[2] / "bench" / "_proxy.py")
proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proxy)


def _max_logits(run_dir: Path) -> list[float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [max(max(st["max_logit"]) for st in r["attention"].values())
            for r in recs if any("max_logit" in st for st in (r.get("attention") or {}).values())]


@pytest.mark.slow
def test_high_lr_without_qk_norm_alerts_on_attention_logits_and_with_it_does_not(tmp_path):
    data = proxy.corpus()[:200_000]
    runs = {}
    for qk in (False, True):
        losses, alerts = proxy.train(0.1, qk_norm=qk, z_loss=0.0, steps=60, monitor_dir=tmp_path / str(qk),
                                     attention_every=5, data=data)
        runs[qk] = (losses, [k for _, k in alerts], _max_logits(tmp_path / str(qk)))
    _, kinds_off, logits_off = runs[False]
    _, kinds_on, logits_on = runs[True]
    assert "attention_logit_growth" in kinds_off
    assert max(logits_off) > 2 * 200  # twice the threshold: the growth is not a near miss
    assert "attention_logit_growth" not in kinds_on and max(logits_on) < 200 / 2
    assert not {"logit_divergence", "update_size", "adam_eps"} & set(kinds_off + kinds_on)


@pytest.mark.slow
def test_qk_norm_drifting_past_the_level_at_lr_0_3_is_not_alerted(tmp_path):
    # with qk-layernorm the largest logit creeps up while the loss keeps up with the stable run: a drift of at
    # most 3.5x per 100 steps, not the runaway the detector names. How far it creeps depends on the rounding of
    # a chaotic run (measured in 600 steps on torch 2.13: 5x by step 80, 93 at step 545 from 3.6; over 1,000
    # steps it once passed 200), so only the drift itself is asserted, with a wide margin. 600 steps, not
    # 1,000: the drift is there by step 80, and every CI pass pays for each step
    losses, alerts = proxy.train(0.3, qk_norm=True, z_loss=0.0, steps=600, seed=1, monitor_dir=tmp_path / "on",
                                 attention_every=5)
    logits = _max_logits(tmp_path / "on")
    assert max(logits) > 5 * logits[0]  # it does grow (from about 3.6 at step 0)
    assert "attention_logit_growth" not in [k for _, k in alerts]
    # the same lr and seed without it runs away within 20 steps
    _, alerts = proxy.train(0.3, qk_norm=False, z_loss=0.0, steps=40, seed=1, monitor_dir=tmp_path / "off",
                            attention_every=5)
    assert [s for s, k in alerts if k == "attention_logit_growth"][0] <= 20
