"""MonitorConfig: TrainingMonitor's settings in one frozen dataclass that the monitor and both trainer
callbacks take; the keywords map onto it in one place, and a bad value fails when the config is built."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from diagnose import MonitorConfig, TrainingMonitor
from diagnose.errors import ConfigError, UsageError
from diagnose.monitor import Thresholds
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


def _run(tmp_path, name, **how):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainingMonitor(model, tmp_path / name, **how) as mon:
        for _ in range(4):
            loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))  # [B*(T-1), V]
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    run = json.loads((tmp_path / name / "run.json").read_text())
    steps = [json.loads(line)["step"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return mon, run["settings"], steps


def test_keywords_and_a_config_are_the_same_monitor(tmp_path):
    mon_kw, settings_kw, steps_kw = _run(tmp_path, "kw", every=2, attention_every=0, clip=1.0, echo=False)
    config = MonitorConfig(every=2, attention_every=0, clip=1.0, echo=False)
    mon_cfg, settings_cfg, steps_cfg = _run(tmp_path, "cfg", config=config)
    assert settings_kw == settings_cfg and steps_kw == steps_cfg == [0, 2]
    assert mon_kw.config == mon_cfg.config == config
    _, settings, steps = _run(tmp_path, "over", config=config, every=1)  # a keyword lays over the config
    assert steps == [0, 1, 2, 3] and settings["clip"] == 1.0


def test_bad_settings_fail_when_the_config_is_built():
    with pytest.raises(ConfigError, match="every must be >= 1"):
        MonitorConfig(every=0)
    with pytest.raises(ConfigError, match="attention_every"):
        MonitorConfig(attention_every=-1)
    with pytest.raises(ConfigError, match="spike_limit must be >= 0"):
        MonitorConfig(spike_limit=-1)
    with pytest.raises(UsageError, match="sinks must be a list"):
        MonitorConfig(sinks="runs/x")
    with pytest.raises(UsageError, match="thresholds must be"):
        MonitorConfig(thresholds={"window": 3})
    with pytest.raises(UsageError, match="unexpected keyword argument 'evry'"):
        MonitorConfig.of(None, {"evry": 2})
    assert MonitorConfig(raise_on="nonfinite").raise_on == frozenset({"nonfinite"})
    with pytest.raises(UsageError, match="TrainingMonitor.. got an unexpected keyword argument 'evry'"):
        TrainingMonitor(torch.nn.Linear(2, 2), None, evry=2)


def test_the_trainer_adds_its_clip_settings_and_sinks_after_the_users():
    mine = lambda scalars, step: None  # noqa: E731  (a plain function is a sink)
    config = MonitorConfig(sinks=[mine], settings={"note": "x"}, thresholds=Thresholds(window=7))
    inside = config.with_trainer(clip=2.0, settings={"integration": "lightning"}, sinks=[lambda s, t: None])
    assert inside.clip == 2.0 and inside.settings == {"note": "x", "integration": "lightning"}
    assert len(inside.sinks) == 2 and inside.sinks[0] is config.sinks[0] and inside.thresholds.window == 7
    assert MonitorConfig(clip=0.5).with_trainer(clip=2.0, settings={}).clip == 0.5  # the user's clip wins


def test_both_callbacks_take_the_config_or_its_keywords():
    pytest.importorskip("transformers")
    pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.hf import DiagnoseHFCallback
    from diagnose.monitor.lightning import DiagnoseCallback

    config = MonitorConfig(every=3, echo=False)
    for callback in (DiagnoseHFCallback, DiagnoseCallback):
        assert callback("runs/x", config=config).config == config
        assert callback("runs/x", every=3, echo=False).config == config
        assert callback("runs/x", config=config, every=5).config.every == 5
        with pytest.raises(ConfigError, match="every must be >= 1"):  # before any training starts
            callback("runs/x", every=0)
        with pytest.raises(UsageError, match=f"{callback.__name__}.. got an unexpected keyword argument 'evry'"):
            callback("runs/x", evry=2)
