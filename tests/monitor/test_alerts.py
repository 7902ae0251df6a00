"""Each detector on hand-made records: fires on the failure, once, with where and hint."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from diagnose.monitor._alerts import AlertEngine, Thresholds, format_alert, hints, kinds
from ..tolerance import approx

pytestmark = pytest.mark.numerics


def rec(step, loss=2.0, gn=1.0, lr=None, layers=None, attention=None, **extra):
    r = {"step": step, "loss": loss, "lr": lr, "grad_norm": gn,
         "layers": layers or {f"blocks.{i}": {"grad_norm": 0.5, "act_mean": 0.0, "act_var": 1.0,
                                              "act_max_abs": 3.0, "token_cos": 0.2} for i in range(2)}}
    if attention:
        r["attention"] = attention
    return {**r, **extra}


def feed(engine, records, **kw):
    return [a for r in records for a in engine.check(r, **kw)]


def noisy(i):
    return 1.0 + 0.05 * math.sin(i)  # a steady signal with a little noise


def test_every_kind_has_a_hint_and_alert_fields():
    assert list(hints()) == list(kinds()) == ["nonfinite", "grad_spike", "loss_spike", "divergence", "vanishing_grad",
                                             "activation_growth", "entropy_collapse", "attention_logit_growth",
                                             "logit_divergence", "rank_collapse", "no_warmup", "update_size",
                                             "adam_eps", "head_vital", "induction_head", "induction_phase_change"]
    e = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])
    out = feed(e, [rec(i, gn=noisy(i)) for i in range(20)] + [rec(20, gn=50.0)])
    assert len(out) == 1
    a = out[0]
    assert set(a) == {"step", "kind", "severity", "where", "message", "hint"}
    assert a["severity"] in ("warning", "error") and "clip" in a["hint"] and "step 20" in format_alert(a)


def test_a_spike_in_a_loop_that_clips_does_not_tell_the_user_to_clip():
    e = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])
    out = feed(e, [rec(i, gn=noisy(i), clip_coef=1.0) for i in range(20)] + [rec(20, gn=50.0, clip_coef=0.02)])
    (a,) = out
    assert a["kind"] == "grad_spike" and "clipping scaled the update by 0.02" in a["message"]
    assert "clip_grad_norm_" not in a["hint"] and "already clips" in a["hint"]
    e = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])  # clipping at 100: this spike is under it
    (a,) = feed(e, [rec(i, gn=noisy(i), clip_coef=1.0) for i in range(20)] + [rec(20, gn=50.0, clip_coef=1.0)])
    assert "under the clipping threshold" in a["message"] and "already clips" in a["hint"]


def test_a_spike_of_tiny_late_gradients_is_not_an_alert():
    e = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])
    early = [rec(0, gn=2.0)]
    late = [rec(i, gn=0.001 * noisy(i)) for i in range(1, 60)]  # a full window (50) after the start: late
    assert feed(e, early + late + [rec(60, gn=0.01)]) == []  # 10x, but 0.5 % of where the run started
    assert [a["kind"] for a in feed(e, [rec(61, gn=0.5)])] == ["grad_spike"]  # 25 % of it: an alert


def test_grad_and_loss_spike_fire_once_then_rearm_after_cooldown():
    e = AlertEngine(Thresholds(cooldown=10), ["blocks.0", "blocks.1"])
    base = [rec(i, gn=noisy(i), loss=2 * noisy(i)) for i in range(20)]
    spikes = [rec(20, gn=30.0, loss=9.0), rec(21, gn=30.0, loss=9.0)]  # two bad steps in a row
    out = feed(e, base + spikes)
    assert sorted((a["kind"], a["step"]) for a in out) == [("grad_spike", 20), ("loss_spike", 20)]
    calm = [rec(i, gn=noisy(i), loss=2 * noisy(i)) for i in range(22, 40)]
    out = feed(e, calm + [rec(40, gn=30.0, loss=2.0)])
    assert [(a["kind"], a["step"]) for a in out] == [("grad_spike", 40)]


def test_spike_needs_history_and_respects_thresholds():
    e = AlertEngine(Thresholds(), [])
    assert feed(e, [rec(0, gn=1.0), rec(1, gn=100.0)]) == []  # no history yet
    e = AlertEngine(Thresholds(grad_spike_ratio=100.0), [])
    assert feed(e, [rec(i, gn=noisy(i)) for i in range(20)] + [rec(20, gn=50.0)]) == []


def test_vanishing_grad_needs_patience_and_names_the_block():
    e = AlertEngine(Thresholds(vanishing_patience=3), ["blocks.0", "blocks.1"])

    def layers(g0):
        return {"blocks.0": {"grad_norm": g0}, "blocks.1": {"grad_norm": 1.0}}

    assert feed(e, [rec(0, layers=layers(1e-5)), rec(1, layers=layers(1e-5)), rec(2, layers=layers(0.5))]) == []
    out = feed(e, [rec(i, layers=layers(1e-5)) for i in range(3, 8)])
    assert [(a["kind"], a["step"], a["where"]) for a in out] == [("vanishing_grad", 5, "blocks.0")]


def test_activation_growth_against_recent_median():
    e = AlertEngine(Thresholds(growth_ratio=100.0), ["blocks.0"])

    def layers(v):
        return {"blocks.0": {"act_var": v}}

    out = feed(e, [rec(i, layers=layers(1.0 + 0.1 * i)) for i in range(10)] + [rec(10, layers=layers(50.0))])
    assert out == []  # 50x: large, but under the threshold
    out = feed(e, [rec(11, layers=layers(500.0))])
    assert [(a["kind"], a["where"]) for a in out] == [("activation_growth", "blocks.0")]


def test_entropy_collapse_relative_to_first_sample():
    e = AlertEngine(Thresholds(), [])

    def att(ent):
        return {"l0.attn": {"entropy": ent, "max_weight": [0.5] * len(ent)}}

    first = [rec(0, attention=att([2.0, 2.0, 2.0, 2.0]))]
    sharp = [rec(5, attention=att([0.5, 0.4, 0.5, 2.0]))]  # learned sharp heads: 20-25 % of the start
    assert feed(e, first + sharp) == []
    out = feed(e, [rec(10, attention=att([0.05, 0.1, 0.02, 1.9]))])
    assert [(a["kind"], a["where"], a["severity"]) for a in out] == [("entropy_collapse", "l0.attn", "error")]
    assert "1/sqrt(d_k)" in out[0]["hint"]


def test_entropy_collapse_from_initialisation_against_uniform_attention():
    def att(ent, uniform=2.2):
        return {"l0.attn": {"entropy": ent, "max_weight": [0.5] * len(ent), "uniform_entropy": uniform}}

    out = feed(AlertEngine(Thresholds(), []), [rec(0, attention=att([0.79, 0.81, 0.7, 0.9]))])  # the run
    assert [(a["kind"], a["step"], a["where"]) for a in out] == [("entropy_collapse", 0, "l0.attn")]
    # the mean entropy is 0.8 (3 digits, away from any rounding tie) against uniform attention's 2.2
    assert "0.800 nats" in out[0]["message"] and "2.200" in out[0]["message"] and "sqrt(d_k)" in out[0]["hint"]
    near_uniform = [rec(0, attention=att([2.1, 2.0, 2.15, 1.9])), rec(5, attention=att([0.9, 0.8, 1.0, 2.0]))]
    assert feed(AlertEngine(Thresholds(), []), near_uniform) == []  # fresh, then sharpening: quiet
    # only the first sample is held to uniform attention: trained heads may rightly be sharp later
    assert feed(AlertEngine(Thresholds(), []), near_uniform[:1] + [rec(5, attention=att([0.7] * 4))]) == []
    assert feed(AlertEngine(Thresholds(init_entropy_frac=0), []), [rec(0, attention=att([0.79] * 4))]) == []


def test_uniform_entropy_counts_the_visible_keys():
    from diagnose.attention_stats import uniform_entropy

    T = 4
    causal = torch.tril(torch.ones(T, T))
    probs = (causal / causal.sum(-1, keepdim=True))[None, None].repeat(2, 3, 1, 1)  # [B, H, T, T]
    expected = sum(math.log(t + 1) for t in range(T)) / T
    assert float(uniform_entropy(probs)) == approx(expected, width=probs.numel())
    pad = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # the second row's last two keys are padding
    probs[1, :, :, 2:] = 0
    probs[1] = probs[1] / probs[1].sum(-1, keepdim=True)
    assert float(uniform_entropy(probs, pad)) == approx((4 * expected + 0 + math.log(2)) / 6, width=probs.numel())


def test_rank_collapse_and_nonfinite_silence_the_rest():
    e = AlertEngine(Thresholds(rank_patience=2), ["blocks.0", "blocks.1", "blocks.2"])
    lay = {"blocks.0": {"token_cos": 0.5}, "blocks.1": {"token_cos": 0.99}, "blocks.2": {"token_cos": 0.99}}
    out = feed(e, [rec(0, layers=lay), rec(1, layers=lay), rec(2, layers=lay)])
    assert [(a["kind"], a["step"], a["where"]) for a in out] == [("rank_collapse", 1, "blocks.1")]
    # the last block alone converging (a pooled classifier's answer) is not a collapse
    last_only = {"blocks.0": {"token_cos": 0.5}, "blocks.1": {"token_cos": 0.5}, "blocks.2": {"token_cos": 0.99}}
    assert feed(AlertEngine(Thresholds(rank_patience=2), list(last_only)), [rec(i, layers=last_only) for i in range(4)]) == []
    # what the demo's healthy 2-layer classifiers hold in their first block (0.975) is not a collapse either
    healthy = {"blocks.0": {"token_cos": 0.975}, "blocks.1": {"token_cos": 0.99}}
    assert feed(AlertEngine(Thresholds(), list(healthy)), [rec(i, layers=healthy) for i in range(10)]) == []
    nan_layers = {"blocks.0": {"act_mean": 0.1, "token_cos": 0.1}, "blocks.1": {"act_mean": float("nan")}}
    out = feed(e, [rec(3, loss=float("nan"), gn=float("nan"), layers=nan_layers)] * 3)
    assert [(a["kind"], a["step"], a["where"]) for a in out] == [("nonfinite", 3, "blocks.1")]


def test_amp_inf_grad_alone_is_a_skipped_step():
    e = AlertEngine(Thresholds(), [])
    assert feed(e, [rec(0, gn=float("inf"), nonfinite_param="w")], amp=True) == []
    out = feed(AlertEngine(Thresholds(), []), [rec(0, gn=float("inf"), nonfinite_param="w")])
    assert [(a["kind"], a["where"]) for a in out] == [("nonfinite", "w")]


def test_no_warmup():
    flat = AlertEngine(Thresholds(), [])
    out = feed(flat, [rec(0, lr=1e-3), rec(1, lr=1e-3), rec(2, lr=1e-3)])
    assert [(a["kind"], a["step"]) for a in out] == [("no_warmup", 1)]
    assert feed(AlertEngine(Thresholds(), []), [rec(0, lr=1e-5), rec(1, lr=2e-5), rec(2, lr=2e-5)]) == []
    assert feed(AlertEngine(Thresholds(warmup_check=False), []), [rec(0, lr=1e-3), rec(1, lr=1e-3)]) == []


def test_a_loss_spike_must_matter_on_the_runs_scale():
    # a run that started at loss 3.0 and converged near 0.005: 0.05 is 10x its median, yet noise
    e = AlertEngine(Thresholds(), [])
    start = [rec(0, gn=1.0, loss=3.0)]
    converged = [rec(i, gn=noisy(i), loss=0.005 * noisy(i)) for i in range(1, 60)]
    assert feed(e, start + converged + [rec(60, gn=1.0, loss=0.05)]) == []
    out = feed(e, [rec(61, gn=1.0, loss=0.5)])  # up by 0.5 = 17 % of the first loss: a real spike
    assert [(a["kind"], a["step"]) for a in out] == [("loss_spike", 61)]


def _climb(start: float, n_flat: int, n_climb: int, top: float) -> list[float]:
    """A flat loss, then a steady climb to `top` over n_climb steps (a slowly diverging run)."""
    return [start * noisy(i) for i in range(n_flat)] + [start + (top - start) * (i + 1) / n_climb
                                                       for i in range(n_climb)]


def test_divergence_fires_on_a_slow_climb_within_20_steps_of_the_doubling():
    losses = _climb(5.5, 10, 60, 100.0)  # the run: 5.5 -> ~100 over 60 steps
    e = AlertEngine(Thresholds(), [])
    out = feed(e, [rec(i, loss=v, gn=noisy(i), lr=1.0) for i, v in enumerate(losses)])
    doubled = next(i for i, v in enumerate(losses) if v >= 2 * losses[0])
    (a,) = [a for a in out if a["kind"] == "divergence"]
    assert doubled <= a["step"] <= doubled + 20 and a["severity"] == "error" and a["where"] == "loss"
    best = min(statistics.median(losses[max(0, i - 4):i + 1]) for i in range(a["step"] + 1))
    assert "diverging" in a["message"] and f"{best:.4g} (step " in a["message"]
    assert a["hint"].startswith("lower the lr first") and "it is 1 now" in a["hint"]
    assert "clip_grad_norm_" in a["hint"]  # the loop does not clip: clipping is advice
    assert "use Pre-LN" not in a["hint"] and "only if the blocks are Post-LN" in a["hint"]


def test_divergence_in_a_loop_that_clips_does_not_tell_it_to_clip():
    e = AlertEngine(Thresholds(), [])
    out = feed(e, [rec(i, loss=v, lr=0.5, clip_coef=0.3) for i, v in enumerate(_climb(3.0, 10, 30, 60.0))])
    (a,) = [a for a in out if a["kind"] == "divergence"]
    assert "clip_grad_norm_" not in a["hint"] and "already clips" in a["hint"]


def test_divergence_stays_quiet_on_healthy_and_converged_runs():
    # a decaying loss with a 4-step bump to 3x (a bad shard): shorter than the patience
    decay = [3.0 * math.exp(-i / 30) * noisy(i) for i in range(200)]
    decay[100:104] = [3 * decay[99]] * 4
    assert feed(AlertEngine(Thresholds(), []), [rec(i, loss=v) for i, v in enumerate(decay)]) == []
    # converged near 0.005, then 4x noise for 20 steps: 4x its best, but 0.5 % of where the run started
    conv = [3.0] + [0.005 * noisy(i) for i in range(1, 60)] + [0.02] * 20
    assert feed(AlertEngine(Thresholds(), []), [rec(i, loss=v) for i, v in enumerate(conv)]) == []
    # the same rise, to a quarter of the first loss and more, is a divergence
    back = [3.0] + [0.005 * noisy(i) for i in range(1, 60)] + [1.0] * 20
    out = feed(AlertEngine(Thresholds(), []), [rec(i, loss=v) for i, v in enumerate(back)])
    assert [a["kind"] for a in out] == ["loss_spike", "divergence"]


def test_divergence_fires_once_per_episode():
    losses = _climb(2.0, 10, 20, 40.0) + [40.0] * 50
    out = feed(AlertEngine(Thresholds(cooldown=10), []), [rec(i, loss=v) for i, v in enumerate(losses)])
    assert [a["kind"] for a in out].count("divergence") == 1


def test_while_the_loss_rises_other_hints_say_lower_the_lr_first():
    e = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])
    losses = _climb(3.0, 10, 20, 60.0)
    base = [rec(i, loss=v, lr=0.8) for i, v in enumerate(losses)]
    feed(e, base)
    grown = {f"blocks.{i}": {"grad_norm": 0.5, "act_var": 1e4, "token_cos": 0.2} for i in range(2)}
    (a,) = feed(e, [rec(30, loss=60.0, lr=0.8, layers=grown)])
    assert a["kind"] == "activation_growth"
    assert a["hint"].startswith("the loss is rising (") and "lower the lr first (it is 0.8 now)" in a["hint"]
    assert "use Pre-LN" not in a["hint"] and "if the blocks are Post-LN" in a["hint"]
    # the same symptom in a run whose loss is not rising keeps its own hint
    calm = AlertEngine(Thresholds(), ["blocks.0", "blocks.1"])
    feed(calm, [rec(i, lr=0.8) for i in range(20)])
    (b,) = feed(calm, [rec(20, lr=0.8, layers=grown)])
    assert b["hint"] == hints()["activation_growth"]


def test_a_loss_spike_in_a_loop_that_clips_does_not_say_clip_gradients():
    e = AlertEngine(Thresholds(), [])
    (a,) = feed(e, [rec(i, loss=2 * noisy(i), clip_coef=1.0) for i in range(20)] + [rec(20, loss=9.0, clip_coef=1.0)])
    assert a["kind"] == "loss_spike" and "clip gradients" not in a["hint"] and "already clips" in a["hint"]
    (b,) = feed(AlertEngine(Thresholds(), []), [rec(i, loss=2 * noisy(i)) for i in range(20)] + [rec(20, loss=9.0)])
    assert "clip gradients" in b["hint"]
