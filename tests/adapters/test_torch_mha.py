"""torch.nn.MultiheadAttention, bare (every option) and inside nn.TransformerEncoder /
nn.TransformerDecoder in eval under no_grad, whose fused fast path skips Python: maps equal
need_weights=True, average_attn_weights=False; outputs untouched; gate = weight zeroing."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import diagnose

from ..hooks import hook_snapshot
from ..tolerance import assert_close, size_of

pytestmark = pytest.mark.numerics


class CrossAttn(nn.Module):
    """One MHA reading a memory; the inputs are a dict so masks can travel along."""

    def __init__(self, batch_first: bool, **kw):
        super().__init__()
        self.batch_first = batch_first
        self.mha = nn.MultiheadAttention(16, 4, batch_first=batch_first, **kw)

    def forward(self, x, memory, key_padding_mask=None, attn_mask=None, need_weights=False):
        if not self.batch_first:
            x, memory = x.transpose(0, 1), memory.transpose(0, 1)
        out, w = self.mha(x, memory, memory, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                          need_weights=need_weights, average_attn_weights=False)
        out = out if self.batch_first else out.transpose(0, 1)
        return (out, w) if need_weights else out


def _inputs(kdim: int = 16, bool_masks: bool = True):
    g = torch.Generator().manual_seed(3)
    x, mem = torch.randn(2, 5, 16, generator=g), torch.randn(2, 6, kdim, generator=g)  # [B, Tq, E], [B, Tk, kdim]
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True  # padded keys
    am = torch.zeros(5, 6, dtype=torch.bool)
    am[0, 2] = True
    if not bool_masks:
        kpm = torch.zeros(2, 6).masked_fill(kpm, float("-inf"))
        am = torch.randn(5, 6, generator=g)
    return {"x": x, "memory": mem, "key_padding_mask": kpm, "attn_mask": am}


CASES = {
    "batch_first": (dict(batch_first=True), {}),
    "seq_first": (dict(batch_first=False), {}),
    "kdim_vdim": (dict(batch_first=True, kdim=8, vdim=8), dict(kdim=8)),
    "bias_kv_zero_attn": (dict(batch_first=True, add_bias_kv=True, add_zero_attn=True), {}),
    "float_masks": (dict(batch_first=False), dict(bool_masks=False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bare_mha(case, model_output, gate_check):
    kw, ikw = CASES[case]
    model = CrossAttn(**kw).eval()
    inputs = _inputs(**ikw)
    with torch.no_grad():
        plain, want = model(**inputs, need_weights=True)  # want: [B, H, Tq, Tk]
    sites = diagnose.find_heads(model)
    assert [(s.name, s.n_heads, s.head_dim, s.adapter.family) for s in sites] == [("mha", 4, 4, "torch-mha")]
    cap = diagnose.capture(model, inputs)
    got = cap.attention[0]
    assert_close(got, want, scale=1.0, **size_of(model))  # recomputed from q, k vs MHA's own weights
    # plain asked for the weights (the explicit softmax), capture's forward did not (MHA's SDPA): other sums
    assert_close(cap.output, plain, **size_of(model))
    gate_check(model, inputs, recomputed=True)


def _encoder(norm_first: bool = False):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.1, batch_first=True, norm_first=norm_first)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()


class Encoder(nn.Module):
    def __init__(self, norm_first: bool = False):
        super().__init__()
        self.encoder = _encoder(norm_first)

    def forward(self, src, src_key_padding_mask=None):
        return self.encoder(src, src_key_padding_mask=src_key_padding_mask)


def _layer_inputs(model: Encoder, inputs) -> list[torch.Tensor]:
    """Each layer's input, from a forward on the Python path (hooks fire there)."""
    seen: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda _m, a: seen.append(a[0])) for layer in model.encoder.layers]
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.no_grad():
            model(**inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("padding", [False, True])
def test_encoder_fast_path(padding, gate_check):
    model = Encoder()
    src = torch.randn(3, 7, 16)  # [B, T, E]
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    if padding:
        kpm[1, 5:] = True
        kpm[2, 3:] = True
    inputs = {"src": src, "src_key_padding_mask": kpm if padding else None}
    with torch.no_grad():
        fast = model(**inputs)  # fused path (nested tensors when padded): no Python hook would fire
    sites = diagnose.find_heads(model)
    assert [s.name for s in sites] == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    before = hook_snapshot(model)
    cap = diagnose.capture(model, inputs)
    assert hook_snapshot(model) == before and torch.backends.mha.get_fastpath_enabled()
    real = ~kpm  # the fused path writes zeros at padded positions; compare real ones
    size = size_of(model)
    assert_close(cap.output[real], fast[real], **size)  # the Python path vs the fused one: other sums
    for site, x, got in zip(sites, _layer_inputs(model, inputs), cap.attention):
        with torch.no_grad():
            _, want = site.module(x, x, x, key_padding_mask=inputs["src_key_padding_mask"], need_weights=True,
                                  average_attn_weights=False)
        assert_close(got, want, scale=1.0, **size)  # recomputed from q, k vs MHA's own weights
    assert list(cap.activations) == ["encoder.layers.0", "encoder.layers.1"]
    gate_check(model, inputs, valid=real, recomputed=True)


def test_decoder_self_and_cross_attention(gate_check):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    dec = nn.TransformerDecoder(layer, num_layers=2).eval()

    class Dec(nn.Module):
        def __init__(self):
            super().__init__()
            self.dec = dec

        def forward(self, tgt, memory):
            mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            return self.dec(tgt, memory, tgt_mask=mask, tgt_is_causal=True)

    model = Dec()
    inputs = {"tgt": torch.randn(2, 5, 16), "memory": torch.randn(2, 6, 16)}
    sites = diagnose.find_heads(model)
    assert [s.name for s in sites] == [f"dec.layers.{i}.{a}" for i in range(2) for a in ("self_attn", "multihead_attn")]
    cap = diagnose.capture(model, inputs)
    assert [tuple(a.shape) for a in cap.attention] == [(2, 4, 5, 5), (2, 4, 5, 6)] * 2
    assert cap.attention[0].triu(1).abs().max() == 0  # causal
    assert_close(cap.attention[1].sum(-1), torch.ones(2, 4, 5), width=6)  # float32 sums of 6 key weights
    gate_check(model, inputs, recomputed=True)


def test_fast_path_restored_when_forward_raises():
    model = Encoder()
    before = hook_snapshot(model)
    with pytest.raises(AssertionError, match="embedding dimension"):
        diagnose.capture(model, {"src": torch.randn(2, 5, 12)}, sites=diagnose.find_heads(model))  # wrong width
    assert hook_snapshot(model) == before and torch.backends.mha.get_fastpath_enabled()


def test_fast_path_restored_when_blocks_are_left_out_of_order():
    """The monitor opens one block for its attention watch and one for head importance, and leaves them in
    the order its steps end: the switch comes back when the last block is left, whatever the order."""
    from diagnose.adapters import no_fastpath

    first, second = no_fastpath(), no_fastpath()
    first.__enter__()
    second.__enter__()
    assert not torch.backends.mha.get_fastpath_enabled()
    first.__exit__(None, None, None)
    assert not torch.backends.mha.get_fastpath_enabled()  # the second block still needs the Python path
    second.__exit__(None, None, None)
    assert torch.backends.mha.get_fastpath_enabled()


def test_a_monitored_encoder_leaves_the_fast_path_on(tmp_path):
    """A training run of an nn.TransformerEncoder under TrainingMonitor, attention and head importance sampled
    on the same steps, leaves torch's fast path as it found it (it was left off for the rest of the process)."""
    from diagnose.monitor import TrainingMonitor

    model = Encoder().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with TrainingMonitor(model, tmp_path / "run", attention_every=1, every=1, echo=False) as monitor:
        for _ in range(3):
            loss = model(torch.randn(2, 5, 16)).pow(2).mean()  # [B, T, E] -> a scalar
            loss.backward()
            monitor.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    assert torch.backends.mha.get_fastpath_enabled()
    with torch.no_grad():
        assert torch.backends.mha.get_fastpath_enabled()
