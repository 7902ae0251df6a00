"""The monitor's flat step vector: one named layout packs, reduces and unpacks it, whatever the
statistics are (adding one to STAT_NAMES must not shift what another file reads)."""

import math

import pytest
import torch

from diagnose._activations import STAT_NAMES, hidden_stats
from diagnose.monitor._layout import ATTENTION_ROWS, StepLayout, pool, record_key, to_pooled

from ..tolerance import F64, approx

EXTENDED = ("skew", *STAT_NAMES[:2], "kurtosis", *STAT_NAMES[2:])  # a new statistic, in front and inside


def _parts(stats, n_blocks=3, heads=(2, 5), n_norms=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n_blocks, len(stats), generator=g, dtype=torch.float64) + 0.5
    attn = [torch.rand(len(ATTENTION_ROWS), h, generator=g) for h in heads]
    for a in attn:
        a[ATTENTION_ROWS.index("uniform_entropy")] = a[ATTENTION_ROWS.index("uniform_entropy"), 0]
    return raw, attn, torch.rand(n_norms, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("stats", [STAT_NAMES, EXTENDED])
def test_round_trip_puts_every_number_back_under_its_name(stats):
    raw, attn, norms = _parts(stats)
    attn_with_gap = [attn[0], None, attn[1]]  # a site that did not run is skipped
    layout = StepLayout.of(raw, attn_with_gap, norms, stats)
    acts = to_pooled(raw, stats)
    v = torch.cat([layout.pack_shared(torch.tensor([2.5]), acts, attn_with_gap), norms]).tolist()
    loss, blocks, sites, got_norms = layout.unpack(v)
    assert loss == 2.5
    # packing copies float64 (and widens float32) values: they come back bit-equal, except the
    # variance, which travels as E[x^2] = var + mean^2 and comes back as E[x^2] - mean^2 (float64
    # rounding of numbers of size E[x^2])
    assert got_norms == norms.tolist()
    assert len(blocks) == raw.shape[0]
    for row, block in zip(raw.tolist(), blocks):
        assert list(block) == [record_key(s) for s in stats]
        m2 = row[stats.index("var")] + row[stats.index("mean")] ** 2
        for name, want in zip(stats, row):
            if name == "var":
                assert block[record_key(name)] == approx(want, scale=m2, dtype=F64), name
            else:
                assert block[record_key(name)] == want, name
    assert len(sites) == len(attn)
    for a, site in zip(attn, sites):
        assert list(site) == list(ATTENTION_ROWS)
        assert site["entropy"] == a[0].tolist()
        assert site["max_weight"] == a[1].tolist()
        assert site["uniform_entropy"] == a[2, 0].item()


@pytest.mark.parametrize("stats", [STAT_NAMES, EXTENDED])
def test_ranks_pool_by_mean_and_max_abs_by_maximum(stats):
    ranks = [_parts(stats, seed=s) for s in range(3)]
    layout = StepLayout.of(ranks[0][0], ranks[0][1], None, stats)
    gathered = torch.stack([layout.pack_shared(torch.tensor([float(r)]), to_pooled(raw, stats), attn)
                            for r, (raw, attn, _) in enumerate(ranks)])
    loss, blocks, sites, _ = layout.unpack(layout.reduce_ranks(gathered).tolist())
    world = len(ranks)
    assert loss == 1.0  # (0 + 1 + 2) / 3: exact
    raws = torch.stack([raw for raw, _, _ in ranks])  # [world, L, S]
    for i, block in enumerate(blocks):
        want = pool(to_pooled(raws[:, i], stats), stats)  # second moments averaged, max_abs maximised
        assert block[record_key("max_abs")] == raws[:, i, stats.index("max_abs")].max().item()  # a maximum: exact
        # float64 means of `world` numbers, taken in another layout (and E[x^2] - mean^2 after)
        mean, m2 = want[stats.index("mean")].item(), want[stats.index("var")].item()
        assert block[record_key("var")] == approx(m2 - mean * mean, scale=m2, width=world, dtype=F64)
        for name in stats:
            if name not in ("max_abs", "var"):
                want_mean = raws[:, i, stats.index(name)].mean().item()
                assert block[record_key(name)] == approx(want_mean, width=world, dtype=F64), name
    # the reference averages the float32 entropies in float32, the layout in float64
    entropy = torch.stack([a[0][0] for _, a, _ in ranks]).mean(0).tolist()
    assert sites[0]["entropy"] == approx(entropy, width=world)


def test_parts_that_do_not_match_the_names_are_refused():
    raw, attn, norms = _parts(STAT_NAMES)
    with pytest.raises(ValueError, match="activation statistics"):
        StepLayout.of(raw, attn, norms, EXTENDED)
    with pytest.raises(ValueError, match="attention statistics"):
        StepLayout.of(raw, [attn[0][:2]], norms)


def test_the_monitor_records_every_statistic_hidden_stats_computes(tmp_path):
    from diagnose.monitor import TrainingMonitor
    from diagnose.zoo import ModelConfig, Transformer

    assert hidden_stats(torch.randn(2, 3, 8)).shape == (len(STAT_NAMES),)
    model = Transformer(ModelConfig(vocab_size=11, n_layers=2, n_heads=2, d_model=16, max_len=8))
    with TrainingMonitor(model, tmp_path / "run", echo=False, attention_every=1) as mon:
        loss = model(torch.randint(0, 11, (2, 8))).float().pow(2).mean()
        loss.backward()
        record = mon.step(loss)
    for layer in record["layers"].values():
        assert set(layer) == {record_key(s) for s in STAT_NAMES} | {"grad_norm"}
        assert math.isfinite(layer["act_var"]) and layer["act_var"] >= 0
    assert record["attention"] and all(list(a) == list(ATTENTION_ROWS) for a in record["attention"].values())
