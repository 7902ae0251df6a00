"""The client models (tests/clients/*) behave as the originals they are written after: forward
signatures and return conventions, the fused attention path equal to the hand-written softmax,
causality, and the files their users hold. Nothing here uses diagnose beyond tests/tolerance.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ..tolerance import approx, assert_close, assert_differ, assert_exact
from . import mingpt, nanogpt, timm_vit, torchvision_vit, xtransformers
from .files import pixel_values, save_images, save_state_dict

pytestmark = pytest.mark.numerics

SIZE = dict(depth=2, width=32)  # every client model here: 2 layers, width 32


def _ids(batch: int = 2, seq: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(seed))  # [B, T] int64


def _assert_causal(logits_of, t: int = 4) -> None:
    """Logits at positions <= t do not move when the tokens after t change; later ones do."""
    ids = _ids()
    later = ids.clone()
    later[:, t + 1:] = (later[:, t + 1:] + 7) % 64
    with torch.no_grad():
        a, b = logits_of(ids), logits_of(later)  # [B, T, V]
    assert_close(a[:, :t + 1], b[:, :t + 1], **SIZE)
    assert_differ(a[:, t + 1:], b[:, t + 1:], **SIZE)


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross-entropy by hand: -log softmax at the target, averaged over every position."""
    logp = logits.double().log_softmax(-1)
    return float(-logp.gather(-1, targets[..., None]).mean())


# nanoGPT ---------------------------------------------------------------------------------------

def test_nanogpt_scores_only_the_last_position_without_targets():
    model, ids = nanogpt.make(), _ids()
    with torch.no_grad():
        last, no_loss = model(ids)
        full, loss = model(ids, ids)
    assert last.shape == (2, 1, 64) and no_loss is None
    assert full.shape == (2, 8, 64)
    assert_close(last[:, 0], full[:, -1], **SIZE)
    assert float(loss) == approx(_nll(full, ids), **SIZE)


def test_nanogpt_flash_equals_its_hand_written_softmax():
    flash, manual = nanogpt.make(), nanogpt.make(flash=False)
    result = manual.load_state_dict(flash.state_dict(), strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == [f"transformer.h.{i}.attn.bias" for i in range(2)]
    ids = _ids()
    with torch.no_grad():
        assert_close(flash(ids, ids)[0], manual(ids, ids)[0], **SIZE)


@pytest.mark.parametrize("flash", [True, False])
def test_nanogpt_is_causal(flash):
    model = nanogpt.make(flash=flash)
    _assert_causal(lambda ids: model(ids, ids)[0])


def test_nanogpt_checkpoint_as_train_py_writes_it(tmp_path):
    model, ids = nanogpt.make(), _ids()
    path = nanogpt.save_like_train_py(model, tmp_path / "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    assert set(ckpt) == {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"}
    assert all(k.startswith("_orig_mod.") for k in ckpt["model"])
    assert {k[len("_orig_mod."):] for k in ckpt["model"]} == set(model.state_dict())
    assert tuple(ckpt["model_args"]) == nanogpt.MODEL_ARGS and ckpt["config"]["compile"] is True
    assert ckpt["best_val_loss"].dim() == 0 and len(ckpt["optimizer"]["state"]) > 0
    loaded = nanogpt.load_like_sample_py(path)
    with torch.no_grad():
        assert_exact(loaded(ids)[0], model(ids)[0])


def test_nanogpt_checkpoint_uncompiled_has_plain_keys(tmp_path):
    model = nanogpt.make(flash=False)
    path = nanogpt.save_like_train_py(model, tmp_path / "ckpt.pt", compiled=False)
    keys = set(torch.load(path, weights_only=True)["model"])
    assert keys == set(model.state_dict()) and "transformer.h.0.attn.bias" in keys
    assert_exact(nanogpt.load_like_sample_py(path, flash=False).lm_head.weight, model.lm_head.weight)


def test_nanogpt_val_bin_is_raw_uint16(tmp_path):
    ids = torch.randint(0, 64, (500,), generator=torch.Generator().manual_seed(2))
    path = nanogpt.write_val_bin(tmp_path / "val.bin", ids.tolist())
    assert path.stat().st_size == 2 * 500  # two bytes a token, no header
    assert np.fromfile(path, dtype=np.uint16).tolist() == ids.tolist()
    x, y = nanogpt.get_batch(path, block_size=16, batch_size=3)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    logits, loss = nanogpt.make()(x, y)
    assert logits.shape == (3, 16, 64) and loss.dim() == 0


# minGPT ----------------------------------------------------------------------------------------

def test_mingpt_returns_every_position_and_a_loss_with_targets():
    model, ids = mingpt.make(), _ids()
    with torch.no_grad():
        logits, no_loss = model(ids)
        same, loss = model(ids, ids)
    assert logits.shape == (2, 8, 64) and no_loss is None
    assert_exact(same, logits)
    assert float(loss) == approx(_nll(logits, ids), **SIZE)


def test_mingpt_mlpf_is_a_lambda_that_a_copy_shares():
    model, ids = mingpt.make(), _ids()
    block = model.transformer.h[0]
    assert callable(block.mlpf) and not isinstance(block.mlpf, torch.nn.Module)
    assert "transformer.h.0.mlpf" not in dict(model.named_modules())
    twin = copy.deepcopy(model).double()
    assert twin.transformer.h[0].mlpf is block.mlpf  # still the original float32 mlp inside
    with pytest.raises(RuntimeError):
        twin(ids)


def test_mingpt_is_causal():
    model = mingpt.make()
    _assert_causal(lambda ids: model(ids)[0])


def test_mingpt_state_dict_round_trip(tmp_path):
    model, ids = mingpt.make(), _ids()
    path = save_state_dict(model, tmp_path / "model.pt")
    other = mingpt.make(seed=1)
    other.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        assert_exact(other(ids)[0], model(ids)[0])


# x-transformers --------------------------------------------------------------------------------

def test_xtransformers_layout_and_returns():
    model, ids = xtransformers.make(), _ids()
    layers = model.attn_layers.layers
    assert len(layers) == 4 and model.attn_layers.layer_types == ("a", "f", "a", "f")
    assert [type(layer[1]).__name__ for layer in layers] == ["Attention", "FeedForward"] * 2
    assert all(len(layer) == 3 and layer[0][1] is None and layer[0][2] is None for layer in layers)
    with torch.no_grad():
        logits = model(ids)
        embeddings = model(ids, return_embeddings=True)
        same, attn = model(ids, return_attn=True)
    assert logits.shape == (2, 8, 64) and embeddings.shape == (2, 8, 32)
    assert_exact(same, logits)
    assert [a.shape for a in attn] == [(2, 2, 8, 8)] * 2
    assert_close(attn[0].sum(-1), torch.ones(2, 2, 8), **SIZE)
    assert_exact(attn[0].triu(1), torch.zeros(2, 2, 8, 8))


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_xtransformers_flash_equals_its_hand_written_softmax(qk_norm, causal):
    flash = xtransformers.make(flash=True, qk_norm=qk_norm, causal=causal)
    manual = xtransformers.make(flash=False, qk_norm=qk_norm, causal=causal)
    manual.load_state_dict(flash.state_dict())
    ids, mask = _ids(), torch.ones(2, 8, dtype=torch.bool)
    mask[1, 6:] = False  # the second sequence is padded at its end
    with torch.no_grad():
        assert_close(flash(ids), manual(ids), **SIZE)
        assert_close(flash(ids, mask=mask), manual(ids, mask=mask), **SIZE)


@pytest.mark.parametrize("flash", [True, False])
def test_xtransformers_decoder_is_causal(flash):
    model = xtransformers.make(flash=flash)
    _assert_causal(lambda ids: model(ids))


@pytest.mark.parametrize("flash", [True, False])
def test_xtransformers_mask_is_true_for_the_tokens_kept(flash):
    model, ids = xtransformers.make(flash=flash, causal=False), _ids()
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[:, 6:] = False
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % 64
    with torch.no_grad():
        a, b = model(ids, mask=mask), model(changed, mask=mask)
        unmasked = model(changed)
    assert_close(a[:, :6], b[:, :6], **SIZE)
    assert_differ(unmasked[:, :6], b[:, :6], **SIZE)


# timm VisionTransformer ------------------------------------------------------------------------

def test_timm_vit_layout_and_returns():
    model, images = timm_vit.make(), pixel_values()
    assert [type(b).__name__ for b in model.blocks] == ["Block", "Block"] and model.blocks[0].attn.fused_attn
    assert model.pos_embed.shape == (1, 17, 32) and model.patch_embed.proj.stride == (4, 4)
    with torch.no_grad():
        features = model.forward_features(images)
        logits = model(images)
    assert features.shape == (4, 17, 32) and logits.shape == (4, 10)
    assert_exact(model.forward_head(features), logits)


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "init_values": 0.1}])
def test_timm_vit_fused_equals_its_hand_written_softmax(options):
    fused, manual = timm_vit.make(**options), timm_vit.make(fused_attn=False, **options)
    manual.load_state_dict(fused.state_dict())
    images = pixel_values()
    keep = torch.ones(17, 17, dtype=torch.bool)
    keep[:, 5:9] = False  # hide four patches from every query
    with torch.no_grad():
        assert_close(fused(images), manual(images), **SIZE)
        assert_close(fused(images, is_causal=True), manual(images, is_causal=True), **SIZE)
        assert_close(fused(images, attn_mask=keep), manual(images, attn_mask=keep), **SIZE)


def test_timm_vit_state_dict_and_images_round_trip(tmp_path):
    model = timm_vit.make()
    path = save_state_dict(model, tmp_path / "vit.pth")
    data = save_images(tmp_path / "images.pt", pixel_values(), torch.arange(4))
    other = timm_vit.make(seed=1)
    other.load_state_dict(torch.load(path, weights_only=True))
    images = torch.load(data, weights_only=True)["pixel_values"]
    assert images.dtype == torch.float32 and images.shape == (4, 3, 16, 16)
    with torch.no_grad():
        assert_exact(other(images), model(images))


# torchvision VisionTransformer -----------------------------------------------------------------

def _mha_by_hand(mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """nn.MultiheadAttention's self-attention from its weights: softmax(q k^T / sqrt(dh)) v, out_proj."""
    B, S, D = x.shape
    H = mha.num_heads
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).split(D, dim=-1)
    q, k, v = (t.view(B, S, H, D // H).transpose(1, 2) for t in (q, k, v))  # [B, H, S, dh]
    att = (q @ k.transpose(-2, -1) / (D // H) ** 0.5).softmax(-1)  # [B, H, S, S]
    return mha.out_proj((att @ v).transpose(1, 2).reshape(B, S, D))


@pytest.mark.parametrize("grad", [False, True])  # no_grad in eval mode takes MHA's fused fast path
def test_torchvision_vit_block_equals_a_hand_computation(grad):
    model, images = torchvision_vit.make(), pixel_values()
    block = model.encoder.layers.encoder_layer_0
    assert block.self_attention.batch_first and type(block.mlp).__name__ == "MLPBlock"
    x = torch.cat([model.class_token.expand(4, -1, -1), model._process_input(images)], dim=1)
    x = x + model.encoder.pos_embedding  # [4, 17, 32]
    with torch.set_grad_enabled(grad):
        got = block(x)
        h = x + _mha_by_hand(block.self_attention, block.ln_1(x))
        want = h + block.mlp(block.ln_2(h))
    assert_close(got.detach(), want.detach(), **SIZE)


def test_torchvision_vit_layout_and_state_dict_round_trip(tmp_path):
    model, images = torchvision_vit.make(), pixel_values()
    names = dict(model.named_modules())
    assert {"conv_proj", "encoder.ln", "heads.head", "encoder.layers.encoder_layer_1.mlp.3"} <= set(names)
    assert model.encoder.pos_embedding.shape == (1, 17, 32)
    path = save_state_dict(model, tmp_path / "vit_b.pth")
    other = torchvision_vit.make(seed=1)
    other.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        logits = model(images)
        assert_exact(other(images), logits)
    assert logits.shape == (4, 10)
    assert_differ(logits[0], logits[1])
