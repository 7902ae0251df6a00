"""Every model family: each head's delta accuracy and delta loss equal those of the same
model with that head's slice of the output-projection weights zeroed (computed here, without
the gate), under zero ablation, with the unchanged-prefix replay on and off."""

from __future__ import annotations


import pytest
import torch
import torch.nn as nn

from diagnose.ablation import ablate_heads
from diagnose.zoo import ModelConfig, Transformer
from diagnose.zoo.families import FAMILIES as TABLE, build, module_at

from ..nano import nanogpt  # the nanoGPT-style module (explicit softmax or SDPA is_causal)
from ..wordlevel import make_tokenizer
from .helpers import assert_untouched, evaluate, loss_tol, snapshot, with_head_weights_zeroed
from ..tolerance import F64, approx, differ, size_of

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")
V, T, N = 40, 8, 12


def _ids(n=N, t=T, v=V, seed=1):
    return torch.randint(1, v, (n, t), generator=torch.Generator().manual_seed(seed))  # [N, T]


def _mask(n=N, t=T):
    mask = torch.ones(n, t, dtype=torch.long)  # [N, T]
    mask[1::3, t - 3:] = 0  # right padding on every third example
    return mask


# ---- custom models ----------------------------------------------------------------------------

class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (fast path in eval) under an embedding and a pooled classifier."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 16)
        layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask):
        x = self.encoder(self.emb(input_ids), src_key_padding_mask=attention_mask == 0)  # [B, T, 16]
        w = attention_mask[:, :, None].float()
        return self.head((x * w).sum(1) / w.sum(1))  # [B, 3]


# ---- the families: (build, data, task, weight_of(model, layer) -> (weight, dim holding inputs)) ----

def _lm_data(mask=True):
    ids = _ids()
    return {"input_ids": ids, "attention_mask": _mask()} if mask else {"input_ids": ids}


def _cls_data(n_classes=3):
    return {"input_ids": _ids(), "attention_mask": _mask(),
            "labels": torch.randint(0, n_classes, (N,), generator=torch.Generator().manual_seed(2))}


def _hf(name, impl, auto=None, **overrides):
    """The family table's tiny model (diagnose/zoo/families.py), at this file's sizes."""
    return build(name, impl, auto=auto, vocab_size=V, max_position_embeddings=16, bos_token_id=0, eos_token_id=0,
                 initializer_range=0.2, **overrides)  # weights large enough that every head visibly matters


def _gpt2(impl):
    return _hf("GPT-2", impl)


def _bert(impl):
    return _hf("BERT", impl, auto="BertForSequenceClassification", num_labels=3)


def _llama(impl):
    return _hf("Llama", impl)


def _gemma(impl):
    return _hf("Gemma", impl)


def _out_proj(name):
    """Layer l's output projection weight from the family table, and the dim that holds its inputs."""
    fam = TABLE[name]
    return lambda model, l: (module_at(model, fam.out_proj, l).weight, 0 if fam.weight_in_out else 1)


def _reference():
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=V, max_len=16, n_layers=2, n_heads=4, d_model=32)).eval()


def _bridge(tmp_path_factory, over: str = "gpt2"):
    from transformer_lens.model_bridge import TransformerBridge

    folder = tmp_path_factory.mktemp("tl") / over
    {"gpt2": _gpt2, "llama": _llama}[over]("eager").save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)  # the bridge loads one; nothing may come from the hub
    return TransformerBridge.boot_transformers(str(folder), device="cpu").eval()


def _linear(attr):
    return lambda model, l: (attr(model, l).weight, 1)


FAMILIES = {
    "reference": (lambda _: _reference(), _lm_data, "lm", _linear(lambda m, l: m.blocks[l].attn.proj), 8),
    "torch-mha": (lambda _: (torch.manual_seed(0), EncoderClassifier().eval())[1], _cls_data, "classification",
                  _linear(lambda m, l: m.encoder.layers[l].self_attn.out_proj), 4),
    "gpt2-eager": (lambda _: _gpt2("eager"), _lm_data, "lm", _out_proj("GPT-2"), 8),  # Conv1D: [in, out]
    "gpt2-sdpa": (lambda _: _gpt2("sdpa"), _lm_data, "lm", _out_proj("GPT-2"), 8),
    "bert-eager": (lambda _: _bert("eager"), _cls_data, "classification", _out_proj("BERT"), 8),
    "bert-sdpa": (lambda _: _bert("sdpa"), _cls_data, "classification", _out_proj("BERT"), 8),
    "llama-eager": (lambda _: _llama("eager"), _lm_data, "lm", _out_proj("Llama"), 8),
    "llama-sdpa": (lambda _: _llama("sdpa"), _lm_data, "lm", _out_proj("Llama"), 8),
    "gemma-eager": (lambda _: _gemma("eager"), _lm_data, "lm", _out_proj("Gemma"), 8),
    "nanogpt-softmax": (lambda _: (torch.manual_seed(0), nanogpt(False).eval())[1], lambda: _lm_data(False), "lm",
                        _linear(lambda m, l: m.h[l].attn.c_proj), 8),
    "nanogpt-sdpa": (lambda _: (torch.manual_seed(0), nanogpt(True).eval())[1], lambda: _lm_data(False), "lm",
                     _linear(lambda m, l: m.h[l].attn.c_proj), 8),
    "tl-bridge": (_bridge, lambda: _lm_data(False), "lm",
                  lambda m, l: (m.blocks[l].attn.o.original_component.weight, 0), 8),
    "tl-bridge-llama": (lambda f: _bridge(f, "llama"), lambda: _lm_data(False), "lm",
                        lambda m, l: (m.blocks[l].attn.o.original_component.weight, 1), 8),
}


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_delta_equals_weight_zeroing(family, reuse, tmp_path_factory):
    if family.startswith("tl-bridge"):
        pytest.importorskip("transformer_lens")
    build, make_data, task, weight_of, head_dim = FAMILIES[family]
    model, data = build(tmp_path_factory), make_data()
    if list(data) == ["input_ids"]:  # models whose forward takes the ids positionally: a Tensor per batch
        batches = [(data["input_ids"][i:i + 5], None) for i in range(0, N, 5)]
    else:
        batches = [({k: v[i:i + 5] for k, v in data.items() if k != "labels"},
                    data["labels"][i:i + 5] if "labels" in data else None) for i in range(0, N, 5)]
    evaluate(model, batches[:1], task)  # TransformerLens registers its own hooks on the first forward
    before = snapshot(model)
    result = ablate_heads(model, batches if list(data) == ["input_ids"] else data, task=task, batch_size=5,
                          progress=False, attention=False, reuse=reuse)
    assert_untouched(model, before)
    assert result.timing["prefix_reuse"] is reuse

    base_acc, base_loss = evaluate(model, batches, task)
    assert result.baseline["accuracy"] == approx(base_acc, scale=1.0, dtype=F64)
    assert result.baseline["loss"] == pytest.approx(base_loss, abs=loss_tol(base_loss, **size_of(model)))
    n_layers = result.model["n_layers"]
    assert len(result.heads) == n_layers * result.model["n_heads"]
    for h in result.heads:
        weight, dim = weight_of(model, h.layer)
        acc, loss = with_head_weights_zeroed(weight, dim, h.head, head_dim, lambda: evaluate(model, batches, task))
        assert h.delta_accuracy == approx(acc - base_acc, scale=1.0, dtype=F64), (h.layer, h.head)
        assert h.delta_loss == pytest.approx(loss - base_loss, abs=loss_tol(loss, base_loss, **size_of(model))), (h.layer, h.head)
    # moved clearly (MARGIN tolerances), not by rounding; small-init models have quiet heads, so each
    # layer needs one: a gate that missed a layer moves none of its heads
    moved = {h.layer for h in result.heads if differ(h.delta_loss, 0.0, scale=max(1.0, base_loss), **size_of(model))}
    assert moved == set(range(n_layers)), "ablations changed (almost) nothing: the gate missed"
    assert_untouched(model, before)
