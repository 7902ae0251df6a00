"""Direct effects on a post-norm BERT equal an independent computation: the model run with the head's
output-projection slice zeroed, every later attention and MLP sublayer's output replaced by its clean
value, and every LayerNorm's normalisation replaced by the affine map with its clean sigma. The output
layers (pooler and classifier, or the MLM head with its own LayerNorm) run as they are."""

from __future__ import annotations

import pytest
import torch
import transformers

from diagnose.ablation import ablate_heads
from diagnose.ablation import direct
from diagnose.objectives import call_model, logits_of, score, targets_for

from .helpers import assert_untouched, snapshot, with_head_weights_zeroed
from ..tolerance import approx, loss_tol, size_of

pytestmark = pytest.mark.numerics

V, T, N, LAYERS, HEADS, D = 30, 7, 10, 3, 4, 8


TASKS = {"classification": "BertForSequenceClassification", "lm": "BertForMaskedLM"}


def _bert(impl: str, task: str = "classification") -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=LAYERS, num_attention_heads=HEADS, hidden_size=HEADS * D,
                                  intermediate_size=64, vocab_size=V, max_position_embeddings=16, num_labels=3,
                                  initializer_range=0.2)
    cfg._attn_implementation = impl
    return getattr(transformers, TASKS[task])(cfg).eval()


def _data(task: str = "classification") -> dict:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[::3, -2:] = 0  # some padding
    ids = torch.randint(1, V, (N, T), generator=g)
    if task == "classification":
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (N,), generator=g)}
    labels = torch.full((N, T), -100)
    labels[:, 1:3] = ids[:, 1:3]  # the masked positions' original tokens
    return {"input_ids": ids.index_fill(1, torch.tensor([1, 2]), 0), "attention_mask": mask, "labels": labels}


def _losses(model, data, task: str = "classification") -> torch.Tensor:
    """Per-example loss sum of one plain forward.  # [N]"""
    inputs = {k: v for k, v in data.items() if k != "labels"}
    with torch.no_grad():
        return score(logits_of(call_model(model, inputs)), targets_for(task, inputs, data["labels"])).loss_sum.double()


def _by_hand(model, data, task: str, layer: int, head: int) -> torch.Tensor:
    """Per-example loss with head `head` of `layer` removed on its direct path only.  # [N]"""
    layers = model.bert.encoder.layer
    sublayers = [m for j, l in enumerate(layers) for m in (l.attention.output.dense, l.output.dense)
                 if j > layer or m is l.output.dense and j == layer]  # all that read the head's change
    norms = [m for l in layers for m in (l.attention.output.LayerNorm, l.output.LayerNorm)]
    out, sigma = {}, {}
    handles = [m.register_forward_hook(lambda m, _a, o: out.__setitem__(m, o.detach())) for m in sublayers]
    handles += [n.register_forward_pre_hook(lambda n, a: sigma.__setitem__(
        n, torch.sqrt(a[0].var(-1, unbiased=False, keepdim=True) + n.eps))) for n in norms]
    try:
        _losses(model, data, task)  # the clean pass: sublayer outputs and each LayerNorm's sigma
    finally:
        for h in handles:
            h.remove()
    handles = [m.register_forward_hook(lambda m, _a, _o: out[m]) for m in sublayers]
    handles += [n.register_forward_hook(lambda n, a, _o: (a[0] - a[0].mean(-1, keepdim=True)) / sigma[n] * n.weight
                                        + n.bias) for n in norms]
    try:
        weight = layers[layer].attention.output.dense.weight  # [d, H * D]: a head's slice is columns
        return with_head_weights_zeroed(weight, 1, head, D, lambda: _losses(model, data, task))
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("impl, task", [("eager", "classification"), ("sdpa", "classification"), ("eager", "lm")])
def test_bert_direct_effect_equals_the_frozen_model_per_example(impl, task, monkeypatch):
    model, data = _bert(impl, task), _data(task)
    accs = []
    run = direct.Direct.run
    monkeypatch.setattr(direct.Direct, "run", lambda self, *a, **kw: accs.append(run(self, *a, **kw)) or accs[-1])
    before = snapshot(model)
    result = ablate_heads(model, data, task=task, batch_size=4, progress=False, attention=False)
    assert_untouched(model, before)
    assert result.direct["measured"] and result.direct["n_heads"] == LAYERS * HEADS, result.direct
    assert "every later layer" in result.direct["norm"]
    clean = _losses(model, data, task)
    loss_sum, _, _, ab_loss, _ = accs[0].arrays()  # per example [N], [N, M]
    assert loss_sum == approx(clean.numpy().tolist(), **size_of(model))
    for m, h in enumerate(result.heads):
        expected = _by_hand(model, data, task, h.layer, h.head)
        tol = loss_tol(*expected.tolist(), *clean.tolist(), **size_of(model))
        assert ab_loss[:, m].tolist() == pytest.approx(expected.tolist(), abs=tol), (h.layer, h.head)
        assert h.direct_delta_loss == pytest.approx(float((expected - clean).sum()) / result.n_units, abs=tol)
    # not vacuous: the frozen path differs from the total effect somewhere, and every layer's heads move the loss
    assert any(abs(h.direct_delta_loss - h.delta_loss) > 10 * tol for h in result.heads)
    assert all(any(abs(h.direct_delta_loss) > 10 * tol for h in result.heads if h.layer == l) for l in range(LAYERS))


def test_bert_path_is_every_layernorm_from_the_head_to_the_encoder_output():
    from diagnose.adapters.readout import residual_path
    from diagnose.sites import find_heads

    model = _bert("eager")
    sites = find_heads(model)
    layers = model.bert.encoder.layer
    for l, site in enumerate(sites):
        path = residual_path(site.adapter, model, site)
        assert path.output is model.bert.encoder
        assert path.norms == tuple(n for j in range(l, LAYERS) for n in (layers[j].attention.output.LayerNorm,
                                                                          layers[j].output.LayerNorm))



def test_bert_with_cross_attention_says_why_not():
    """A decoder layer's cross-attention LayerNorm also sits on the path; that path is not declared."""
    from diagnose.sites import find_heads

    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, intermediate_size=16,
                                  vocab_size=V, max_position_embeddings=16, is_decoder=True, add_cross_attention=True)
    cfg._attn_implementation = "eager"
    model = transformers.BertLMHeadModel(cfg).eval()
    paths, reason = direct.readiness(find_heads(model), model)
    assert paths is None and "cross-attention" in reason and "\n" not in reason
