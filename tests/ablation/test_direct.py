"""Direct effects (ablation/direct.py) against a planted self-repair and an independent computation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from diagnose.ablation.engine import ablate_heads
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx, loss_tol
from .planted_repair import planted_data, planted_repair

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def planted():
    model, data = planted_repair(), planted_data()
    return model, data, ablate_heads(model, data, task="classification", batch_size=16, attention=False)


def test_planted_writer_is_compensated(planted):
    _, _, result = planted
    writer, idle = result.head(0, 0), result.head(0, 1)
    band = result.significance["negligible_band"]["loss"]
    assert result.direct["measured"] and result.direct["n_heads"] == 2
    # the repair hides it from the total: inside the negligible band (a shift this small may still be
    # detectable, every example moving alike; "matters" needs both, verdict.classify)
    assert max(map(abs, writer.delta_loss_ci)) < band and abs(writer.delta_accuracy) < 0.02
    assert writer.direct_delta_loss > 0.5 * math.log(2) and writer.direct_significant
    assert writer.direct_delta_loss_ci[0] > band  # the interval, not only the point, clears the band
    assert writer.self_repair == approx(writer.direct_delta_loss - writer.delta_loss)
    assert writer.compensated is True
    assert idle.compensated is False and not idle.direct_significant


def _independent(model: Transformer, data: dict, site: int, head: int) -> float:
    """The direct effect by hand, without gates: the final stream is the embedding plus each sublayer's
    clean output, with the head's own output removed from its attention output only; the final
    LayerNorm uses the clean stream's mean-free sigma (frozen), then pooling and the classifier."""
    ids, labels = data["input_ids"], data["labels"]
    with torch.no_grad():
        x = model.tok_emb(ids)  # [N, T, d] (positions "none")
        stream, removed = x, x
        for i, block in enumerate(model.blocks):
            attn = block.attn(block.ln1(stream))
            if i == site:  # the same attention with the head's slice of the output projection cut
                cut = copy.deepcopy(block.attn)
                D = cut.head_dim
                cut.proj.weight[:, head * D:(head + 1) * D] = 0.0
                removed = removed + cut(block.ln1(stream)) - attn
            stream = stream + attn
            mlp = block.mlp(block.ln2(stream))
            stream = stream + mlp
        removed = removed - x + stream  # the clean final stream minus the head's contribution
        ln = model.ln_f
        sigma = torch.sqrt(stream.var(-1, unbiased=False, keepdim=True) + ln.eps)  # [N, T, 1], clean
        normed = (removed - removed.mean(-1, keepdim=True)) / sigma * ln.weight + ln.bias
        clean = F.cross_entropy(model.head(ln(stream)[:, 0]), labels, reduction="mean")
        direct = F.cross_entropy(model.head(normed[:, 0]), labels, reduction="mean")
    return float(direct - clean)


def test_direct_effect_equals_an_independent_computation(planted):
    model, data, result = planted
    for head in (0, 1):
        expected = _independent(model, data, 0, head)
        assert result.head(0, head).direct_delta_loss == pytest.approx(expected, abs=loss_tol(expected, depth=1,
                                                                                              width=8))


def test_independent_check_on_a_random_two_layer_model():
    """The same check where every head has some direct effect and later layers read the earlier ones."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=3, max_len=6, n_layers=2, n_heads=2,
                                    d_model=16, positions="none", pooling="first", init_std=0.4)).eval()
    ids = torch.randint(1, 10, (24, 6))
    data = {"input_ids": ids, "labels": torch.arange(24) % 3}
    result = ablate_heads(model, data, task="classification", batch_size=8, attention=False)
    for h in result.heads:
        expected = _independent(model, data, h.layer, h.head)
        assert h.direct_delta_loss == pytest.approx(expected, abs=loss_tol(expected, depth=2, width=16))
    last = [h for h in result.heads if h.layer == 1]
    assert any(abs(h.direct_delta_loss) > 10 * loss_tol(1.0, depth=2, width=16) for h in last)


def test_post_norm_model_is_measured_through_a_traced_forward():
    """The reference adapter declares a path for pre-norm only; a post-norm one is traced (test_direct_traced.py
    checks its numbers), and the result says which way and why the declared one did not apply."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=2, max_len=6, n_layers=1, n_heads=2,
                                    d_model=8, norm="post"))
    data = {"input_ids": torch.randint(1, 10, (8, 6)), "labels": torch.arange(8) % 2}
    result = ablate_heads(model, data, task="classification", batch_size=8, attention=False)
    assert result.direct["measured"] is True and result.direct["path"].startswith("traced"), result.direct
    assert all(h.direct_delta_loss is not None and h.compensated is not None for h in result.heads)


def test_direct_off_and_json(planted):
    model, data, result = planted
    off = ablate_heads(model, data, task="classification", batch_size=16, attention=False, direct=False)
    assert off.direct is None and off.head(0, 0).direct_delta_loss is None
    assert off.head(0, 0).delta_loss == result.head(0, 0).delta_loss  # the total effects do not depend on it
    js = result.to_json()
    assert js["schema"] == "diagnose.heads/2" and js["direct"]["measured"]
    assert js["heads"][0]["compensated"] is True and len(js["heads"][0]["direct_delta_loss_ci"]) == 2


def test_report_shows_direct_effects_and_compensated_heads(planted, tmp_path):
    import re

    import diagnose

    _, _, result = planted
    page = diagnose.write_report([result], tmp_path / "r.html").read_text()
    assert "Direct against total effect (self-repair)" in page
    table = re.search(r'<table class="compensated">.*?</table>', page, re.S).group(0)
    assert "L0.H0" in table and "L0.H1" not in table
    old = result.to_json()
    old["schema"] = "diagnose.heads/1"
    del old["direct"]
    for h in old["heads"]:
        for k in [k for k in h if k.startswith("direct_") or k in ("self_repair", "compensated")]:
            del h[k]
    page = diagnose.write_report([old], tmp_path / "old.html").read_text()
    assert "Direct against total effect" not in page  # a /1 document still reads, without the section


@pytest.mark.parametrize("options", [dict(method="mean"), dict(fast=True, top=1)])
def test_mean_method_and_fast_find_the_planted_head_too(options):
    """Mean ablation (the writer's mean output is 0 on balanced data) and --fast (the verified heads only)."""
    result = ablate_heads(planted_repair(), planted_data(), task="classification", batch_size=16, attention=False,
                          **options)
    assert result.head(0, 0).compensated is True
    assert result.direct["n_heads"] == sum(h.verified for h in result.heads)
    assert all(h.direct_delta_loss is None for h in result.heads if not h.verified)


def test_fast_with_nothing_verified_says_why():
    result = ablate_heads(planted_repair(), planted_data(), task="classification", batch_size=16, attention=False,
                          fast=True, top=0)
    assert result.direct["measured"] is False and "--top 0" in result.direct["reason"]
