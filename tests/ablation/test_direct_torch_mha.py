"""Direct effects on PyTorch's own nn.TransformerEncoder (pre-norm with and without the encoder's final
norm, post-norm) equal an independent computation: the model run with the head's out_proj input slice
zeroed, every later attention and feed-forward sublayer's output replaced by its clean value, and every
norm replaced by the affine map with its clean scale. The classifier runs as it is."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from diagnose.ablation import ablate_heads
from diagnose.ablation import direct
from diagnose.objectives import score
from diagnose.adapters._torch_mha import no_fastpath  # torch's own switch: the fused path skips every hook
from diagnose.sites import find_heads

from .helpers import assert_untouched, snapshot, with_head_weights_zeroed
from ..tolerance import approx, loss_tol, size_of

pytestmark = pytest.mark.numerics

V, T, N, LAYERS, HEADS, D, C = 20, 6, 10, 2, 4, 4, 3


class Classifier(nn.Module):
    """embedding -> nn.TransformerEncoder -> a linear classifier on the mean or the first position."""

    def __init__(self, norm_first: bool, final_norm: bool, pool: str, rms: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, HEADS * D)
        layer = nn.TransformerEncoderLayer(HEADS * D, HEADS, dim_feedforward=32, batch_first=True,
                                           norm_first=norm_first)
        if rms:
            layer.norm1, layer.norm2 = nn.RMSNorm(HEADS * D), nn.RMSNorm(HEADS * D)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(HEADS * D) if final_norm else None,
                                             enable_nested_tensor=not norm_first)  # torch's fused path where it has one
        for n in self.modules():  # norms that do something: random gains and biases
            if isinstance(n, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.normal_(n.weight, 1.0, 0.5)
                if getattr(n, "bias", None) is not None:
                    nn.init.normal_(n.bias, 0.0, 0.5)
        self.head = nn.Linear(HEADS * D, C)
        self.pool = pool

    def forward(self, input_ids, attention_mask):
        h = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)  # [B, T, d]
        if self.pool == "first":
            return self.head(h[:, 0])  # [B, C]
        m = attention_mask[..., None].to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))  # [B, C]


def _data() -> dict:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[::3, -2:] = 0  # some padding
    return {"input_ids": torch.randint(0, V, (N, T), generator=g), "attention_mask": mask,
            "labels": torch.randint(0, C, (N,), generator=g)}


def _losses(model, data) -> torch.Tensor:
    """Per-example loss of one plain forward.  # [N]"""
    with torch.no_grad(), no_fastpath():
        logits = model(data["input_ids"], data["attention_mask"])
    return score(logits, data["labels"]).loss_sum.double()


def _frozen(n: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """n(x) with its scale (sigma or rms, [B, T, 1]) given rather than taken from x."""
    if isinstance(n, nn.LayerNorm):
        return (x - x.mean(-1, keepdim=True)) / scale * n.weight + n.bias
    return x / scale * n.weight


def _scale(n: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(n, nn.LayerNorm):
        return torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + n.eps)
    eps = torch.finfo(x.dtype).eps if n.eps is None else n.eps
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _by_hand(model, data, layer: int, head: int) -> torch.Tensor:
    """Per-example loss with head `head` of `layer` removed on its direct path only.  # [N]"""
    layers = model.encoder.layers
    sublayers = [m for j, l in enumerate(layers) for m in (l.self_attn, l.linear2)
                 if j > layer or m is l.linear2 and j == layer]  # all that read the head's change
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    out, scale = {}, {}
    handles = [m.register_forward_hook(lambda m, _a, o: out.__setitem__(m, o)) for m in sublayers]
    handles += [n.register_forward_pre_hook(lambda n, a: scale.__setitem__(n, _scale(n, a[0]))) for n in norms]
    try:
        _losses(model, data)  # the clean pass: sublayer outputs and each norm's scale
    finally:
        for h in handles:
            h.remove()
    handles = [m.register_forward_hook(lambda m, _a, _o: out[m]) for m in sublayers]
    handles += [n.register_forward_hook(lambda n, a, _o: _frozen(n, a[0], scale[n])) for n in norms]
    try:
        weight = layers[layer].self_attn.out_proj.weight  # [d, H * D]: a head's slice of the input is columns
        return with_head_weights_zeroed(weight, 1, head, D, lambda: _losses(model, data))
    finally:
        for h in handles:
            h.remove()


CASES = {  # name -> (norm_first, final norm, pool, RMSNorm in the layers)
    "pre-norm, final norm": (True, True, "mean", False),
    "pre-norm, no final norm": (True, False, "first", False),
    "post-norm": (False, False, "mean", False),
    "post-norm, final norm": (False, True, "first", False),
    "post-norm, RMSNorm": (False, False, "mean", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_encoder_direct_effect_equals_the_frozen_model_per_example(case, monkeypatch):
    model, data = Classifier(*CASES[case]).eval(), _data()
    accs = []
    run = direct.Direct.run
    monkeypatch.setattr(direct.Direct, "run", lambda self, *a, **kw: accs.append(run(self, *a, **kw)) or accs[-1])
    before = snapshot(model)
    result = ablate_heads(model, data, task="classification", batch_size=4, progress=False, attention=False)
    assert_untouched(model, before)
    assert torch.backends.mha.get_fastpath_enabled()
    assert result.direct["measured"] and result.direct["n_heads"] == LAYERS * HEADS, result.direct
    clean = _losses(model, data)
    loss_sum, _, _, ab_loss, _ = accs[0].arrays()  # per example [N], [N, M]
    assert loss_sum == approx(clean.numpy().tolist(), **size_of(model))
    for m, h in enumerate(result.heads):
        expected = _by_hand(model, data, h.layer, h.head)
        tol = loss_tol(*expected.tolist(), *clean.tolist(), **size_of(model))
        assert ab_loss[:, m].tolist() == pytest.approx(expected.tolist(), abs=tol), (h.layer, h.head)
        assert h.direct_delta_loss == pytest.approx(float((expected - clean).sum()) / result.n_units, abs=tol)
    assert_untouched(model, before)
    # not vacuous: the frozen path differs from the total effect somewhere, and every layer's heads move the loss
    assert any(abs(h.direct_delta_loss - h.delta_loss) > 10 * tol for h in result.heads)
    assert all(any(abs(h.direct_delta_loss) > 10 * tol for h in result.heads if h.layer == l) for l in range(LAYERS))


@pytest.mark.parametrize("norm_first", [True, False])
def test_torch_encoder_path(norm_first):
    from diagnose.adapters.readout import residual_path

    model = Classifier(norm_first, True, "mean")
    enc = model.encoder
    for l, site in enumerate(find_heads(model)):
        path = residual_path(site.adapter, model, site)
        assert path.output is enc
        later = () if norm_first else tuple(n for j in range(l, LAYERS) for n in (enc.layers[j].norm1,
                                                                                 enc.layers[j].norm2))
        assert path.norms == later + (enc.norm,)


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(16, 4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
                                batch_first=True)

    def forward(self, x):
        return self.t(x, x)


def _group_norms() -> nn.Module:
    model = Classifier(False, False, "mean")
    model.encoder.layers[1].norm2 = nn.GroupNorm(1, HEADS * D)
    return model


class _Bare(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x)[0]


REFUSED = {  # model -> what the one-line reason names
    "decoder": (_Decoder, "cross-attention"),
    "other norm": (_group_norms, "GroupNorm"),
    "bare attention": (_Bare, "not the self-attention of an nn.TransformerEncoder"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_torch_mha_without_a_known_path_says_why(case):
    build, why = REFUSED[case]
    model = build().eval()
    paths, reason = direct.readiness(find_heads(model), model)
    assert paths is None and why in reason and "\n" not in reason, reason
