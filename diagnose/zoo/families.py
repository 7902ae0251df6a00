"""The one table of model families diagnose is checked against: tiny, randomly initialised Hugging Face
models built from configs (nothing is downloaded), read by the tests (tests/ablation/test_families.py,
tests/prune/test_hf.py, ...) and by `make families` (bench/families.py).

Each entry says how to build the architecture (its model type, auto class, config overrides of SMALL,
the inputs it takes) and what a test needs to check the adapter independently of it: which adapter
family is meant to serve it, where layer l's output projection and the final norm sit (paths from the
model). Which modules are attention layers, how heads are cut and how norms are frozen stay declared
in the adapters (diagnose/adapters/); this table only names models to try them on.

Importing this module costs no transformers; `config` and `build` import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SMALL = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@dataclass(frozen=True)
class Family:
    """One architecture. kind: the inputs it takes ("lm", "mlm", "seq2seq", "audio", "image"); adapter: the
    adapter family meant to serve it (None: found by the generic adapter); out_proj, final_norm: paths from
    the model with `{layer}` for the layer ("transformer.h.{layer}.attn.c_proj"), where a test needs them;
    weight_in_out: the output projection's weight is stored [in, out] (GPT-2's Conv1D)."""

    model_type: str
    auto: str
    config: dict[str, Any] = field(default_factory=dict)
    kind: str = "lm"
    adapter: str | None = None
    out_proj: str | None = None
    final_norm: str | None = None
    weight_in_out: bool = False


_KV = {"num_key_value_heads": 2}
FAMILIES: dict[str, Family] = {
    "GPT-2": Family("gpt2", "AutoModelForCausalLM", adapter="hf-gpt2", out_proj="transformer.h.{layer}.attn.c_proj",
                    final_norm="transformer.ln_f", weight_in_out=True),
    "GPT-Neo": Family("gpt_neo", "AutoModelForCausalLM", {"attention_types": [[["global", "local"], 1]],
                                                          "num_layers": 2, "window_size": 4}),
    "GPT-NeoX": Family("gpt_neox", "AutoModelForCausalLM"),
    "GPT-J": Family("gptj", "AutoModelForCausalLM", {"rotary_dim": 4}),
    "OPT": Family("opt", "AutoModelForCausalLM", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "Bloom": Family("bloom", "AutoModelForCausalLM"),
    "Falcon": Family("falcon", "AutoModelForCausalLM", {"alibi": False, "new_decoder_architecture": False,
                                                        "multi_query": False}),
    "Llama": Family("llama", "AutoModelForCausalLM", _KV, adapter="hf-llama",
                    out_proj="model.layers.{layer}.self_attn.o_proj", final_norm="model.norm"),
    "Mistral": Family("mistral", "AutoModelForCausalLM", _KV, adapter="hf-llama"),
    "Qwen2": Family("qwen2", "AutoModelForCausalLM", _KV, adapter="hf-llama"),
    "Qwen3": Family("qwen3", "AutoModelForCausalLM", {**_KV, "head_dim": 8}, adapter="hf-llama"),
    "Gemma": Family("gemma", "AutoModelForCausalLM", {**_KV, "head_dim": 8}, adapter="hf-llama",
                    out_proj="model.layers.{layer}.self_attn.o_proj", final_norm="model.norm"),
    "Gemma2": Family("gemma2", "AutoModelForCausalLM", {**_KV, "head_dim": 8}, adapter="hf-llama"),
    "Gemma3 (text)": Family("gemma3_text", "AutoModelForCausalLM", {**_KV, "head_dim": 8}, adapter="hf-llama"),
    "Phi": Family("phi", "AutoModelForCausalLM"),
    "Phi3": Family("phi3", "AutoModelForCausalLM", _KV),
    "StableLM": Family("stablelm", "AutoModelForCausalLM", _KV),
    "OLMo": Family("olmo", "AutoModelForCausalLM"),
    "OLMo2": Family("olmo2", "AutoModelForCausalLM"),
    "BERT": Family("bert", "AutoModelForMaskedLM", kind="mlm", adapter="hf-bert",
                   out_proj="bert.encoder.layer.{layer}.attention.output.dense"),
    "RoBERTa": Family("roberta", "AutoModelForMaskedLM", {"pad_token_id": 1}, kind="mlm", adapter="hf-bert"),
    "XLM-R": Family("xlm-roberta", "AutoModelForMaskedLM", {"pad_token_id": 1}, kind="mlm", adapter="hf-bert"),
    "DistilBERT": Family("distilbert", "AutoModelForMaskedLM", {"dim": 32, "hidden_dim": 64, "n_heads": 4,
                                                                "n_layers": 2}, kind="mlm"),
    "ALBERT": Family("albert", "AutoModelForMaskedLM", {"embedding_size": 16}, kind="mlm"),
    "ELECTRA": Family("electra", "AutoModelForMaskedLM", {"embedding_size": 32}, kind="mlm", adapter="hf-bert"),
    "DeBERTa-v2": Family("deberta-v2", "AutoModelForMaskedLM", kind="mlm"),
    "ModernBERT": Family("modernbert", "AutoModelForMaskedLM", {"global_attn_every_n_layers": 1}, kind="mlm"),
    "T5": Family("t5", "AutoModelForSeq2SeqLM", {"d_kv": 8, "d_ff": 64, "num_decoder_layers": 2,
                                                 "decoder_start_token_id": 0}, kind="seq2seq"),
    "BART": Family("bart", "AutoModelForSeq2SeqLM", {"encoder_layers": 2, "decoder_layers": 2,
                                                     "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                                                     "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                                                     "decoder_start_token_id": 2}, kind="seq2seq"),
    "Whisper": Family("whisper", "AutoModelForSpeechSeq2Seq", {"num_mel_bins": 8, "encoder_layers": 2,
                                                               "decoder_layers": 2, "encoder_attention_heads": 4,
                                                               "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
                                                               "decoder_ffn_dim": 64, "max_source_positions": 8,
                                                               "max_target_positions": 16,
                                                               "decoder_start_token_id": 1}, kind="audio"),
    "ViT": Family("vit", "AutoModelForImageClassification", {"image_size": 16, "patch_size": 4}, kind="image"),
    "CLIP vision": Family("clip_vision_model", "CLIPVisionModel", {"image_size": 16, "patch_size": 4}, kind="image"),
}


def config(name: str, impl: str = "eager", **overrides: Any):
    """The family's tiny transformers config, SMALL and its own overrides first, then `overrides`."""
    import transformers

    fam = FAMILIES[name]
    cfg = transformers.AutoConfig.for_model(fam.model_type, **{**SMALL, **fam.config, **overrides})
    cfg._attn_implementation = impl
    return cfg


def build(name: str, impl: str = "eager", *, auto: str | None = None, state: dict | None = None, seed: int = 0,
          **overrides: Any):
    """The family's tiny model in eval mode, seeded; `auto` another class for it (a sequence classifier
    instead of its LM head), `state` weights to load (the same model under another implementation)."""
    import torch
    import transformers

    cfg = config(name, impl, **overrides)
    torch.manual_seed(seed)
    cls = getattr(transformers, auto or FAMILIES[name].auto)
    model = (cls.from_config(cfg) if hasattr(cls, "from_config") and cls.__name__.startswith("Auto") else cls(cfg))
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def module_at(model: Any, path: str, layer: int | None = None) -> Any:
    """The module at `path` of the table ({layer} filled in)."""
    return model.get_submodule(path.format(layer=layer))
