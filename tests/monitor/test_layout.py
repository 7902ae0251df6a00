"""The monitor's flat step vector: one named layout packs, reduces and unpacks the measurements,
whatever they are (adding a statistic or a measurement must not shift what another reads)."""

import math

import pytest
import torch

from diagnose._activations import STAT_NAMES, hidden_stats
from diagnose.errors import ConfigError, DataError
from diagnose.monitor._layout import ACTIVATION_REDUCE, ATTENTION_ROWS, StepLayout, pool, record_key, to_pooled
from diagnose.monitor._measure import Measurement
from diagnose.monitor._probes import ATTENTION, GRAD_NORMS, LOSS, ActivationProbe

from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics

EXTENDED = ("skew", *STAT_NAMES[:2], "kurtosis", *STAT_NAMES[2:])  # a new statistic, in front and inside


def _measurements(stats):
    acts = Measurement("activations", stats, "layer", (), ActivationProbe, reduce=ACTIVATION_REDUCE)
    return LOSS, acts, ATTENTION, GRAD_NORMS


def _parts(stats, n_blocks=3, heads=(2, 5), n_norms=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n_blocks, len(stats), generator=g, dtype=torch.float64) + 0.5
    attn = [torch.rand(len(ATTENTION_ROWS), h, generator=g) for h in heads]
    for a in attn:
        a[ATTENTION_ROWS.index("uniform_entropy")] = a[ATTENTION_ROWS.index("uniform_entropy"), 0]
    return raw, attn, torch.rand(n_norms, generator=g, dtype=torch.float64)


def _measured(stats, loss, acts, attn, norms):
    loss_m, acts_m, attn_m, norms_m = _measurements(stats)
    return [(loss_m, torch.tensor([[loss]])), (acts_m, acts), (attn_m, attn),
            (norms_m, [] if norms is None else [norms[None]])]


@pytest.mark.parametrize("stats", [STAT_NAMES, EXTENDED])
def test_round_trip_puts_every_number_back_under_its_name(stats):
    raw, attn, norms = _parts(stats)
    attn_with_gap = [attn[0], None, attn[1]]  # a site that did not run is skipped
    measured = _measured(stats, 2.5, raw, attn_with_gap, norms)
    layout = StepLayout.of(measured)
    got = layout.unpack(layout.pack(measured, torch.device("cpu")).tolist())
    assert got["loss"] == [{"loss": [2.5]}]
    # packing copies float64 (and widens float32) values: they come back bit-equal
    assert got["grad_norms"] == [{"norm": norms.tolist()}]
    assert [{k: v[0] for k, v in block.items()} for block in got["activations"]] == [
        dict(zip(stats, row)) for row in raw.tolist()]
    assert len(got["attention"]) == len(attn)
    for a, site in zip(attn, got["attention"]):
        assert site == {row: a[r].tolist() for r, row in enumerate(ATTENTION_ROWS)}
    assert layout.shared == 1 + raw.numel() + sum(a.numel() for a in attn)  # the gradient norms come last


@pytest.mark.parametrize("stats", [STAT_NAMES, EXTENDED])
def test_ranks_pool_by_mean_and_max_abs_by_maximum(stats):
    ranks = [_parts(stats, seed=s) for s in range(3)]
    measured = [_measured(stats, float(r), to_pooled(raw, stats), attn, None) for r, (raw, attn, _) in enumerate(ranks)]
    layout = StepLayout.of(measured[0])
    gathered = torch.stack([layout.pack(m, torch.device("cpu")) for m in measured])
    got = layout.unpack(layout.reduce_ranks(gathered).tolist())
    world = len(ranks)
    assert got["loss"][0]["loss"] == [1.0]  # (0 + 1 + 2) / 3: exact
    raws = torch.stack([raw for raw, _, _ in ranks])  # [world, L, S]
    for i, block in enumerate(got["activations"]):
        want = pool(to_pooled(raws[:, i], stats), stats)  # second moments averaged, max_abs maximised
        assert block["max_abs"] == [raws[:, i, stats.index("max_abs")].max().item()]  # a maximum: exact
        # float64 means of `world` numbers, taken in another layout
        assert block["var"][0] == approx(want[stats.index("var")].item(), width=world, dtype=F64)
        for name in stats:
            if name in ("max_abs", "var"):
                continue
            want_mean = raws[:, i, stats.index(name)].mean().item()
            assert block[name][0] == approx(want_mean, width=world, dtype=F64), name
    # the reference averages the float32 entropies in float32, the layout in float64
    entropy = torch.stack([a[0][0] for _, a, _ in ranks]).mean(0).tolist()
    assert got["attention"][0]["entropy"] == approx(entropy, width=world)


def test_a_sum_rule_sums_and_a_min_rule_takes_the_minimum_across_ranks():
    m = Measurement("toy", ("total", "low", "avg"), "model", ("toy",), ActivationProbe,
                    reduce={"total": "sum", "low": "min"})
    ranks = [torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[2.0, 3.0, 4.0]])]
    layout = StepLayout.of([(m, ranks[0])])
    gathered = torch.stack([layout.pack([(m, r)], torch.device("cpu")) for r in ranks])
    assert layout.unpack(layout.reduce_ranks(gathered).tolist()) == {"toy": [{"total": [3.0], "low": [3.0],
                                                                              "avg": [3.0]}]}


def test_parts_that_do_not_match_the_names_are_refused():
    raw, attn, norms = _parts(STAT_NAMES)
    with pytest.raises(DataError, match="activations statistics"):
        StepLayout.of(_measured(EXTENDED, 1.0, raw, attn, norms))
    with pytest.raises(ValueError, match="attention statistics"):  # a DataError is also a ValueError
        StepLayout.of(_measured(STAT_NAMES, 1.0, raw, [attn[0][:2]], norms))


def test_a_measurement_with_a_bad_rule_or_unit_is_refused():
    with pytest.raises(ConfigError, match="per must be one of"):
        Measurement("toy", ("a",), "token", (), ActivationProbe)
    with pytest.raises(ConfigError, match="reduce 'a': 'median'"):
        Measurement("toy", ("a",), "model", (), ActivationProbe, reduce={"a": "median"})
    with pytest.raises(ConfigError, match="rows must be distinct"):
        Measurement("toy", ("a", "a"), "model", (), ActivationProbe)


def test_the_monitor_records_every_statistic_hidden_stats_computes(tmp_path):
    from diagnose.monitor import TrainingMonitor
    from diagnose.zoo import ModelConfig, Transformer

    assert hidden_stats(torch.randn(2, 3, 8)).shape == (len(STAT_NAMES),)
    model = Transformer(ModelConfig(vocab_size=11, n_layers=2, n_heads=2, d_model=16, max_len=8))
    with TrainingMonitor(model, tmp_path / "run", every=1, echo=False, attention_every=1) as mon:
        loss = model(torch.randint(0, 11, (2, 8))).float().pow(2).mean()
        loss.backward()
        record = mon.step(loss)
    for layer in record["layers"].values():
        assert set(layer) == {record_key(s) for s in STAT_NAMES} | {"grad_norm"}
        assert math.isfinite(layer["act_var"]) and layer["act_var"] >= 0
    # the attention probe's rows first, then the max pre-softmax logit, which the reference model hands over too,
    # then each head's importance and role shares (_head_importance.py)
    from diagnose.monitor._head_importance import HEAD_ROWS

    assert record["attention"] and all(list(a) == [*ATTENTION_ROWS, "max_logit", *HEAD_ROWS]
                                       for a in record["attention"].values())
