"""Causal leak: does the output at position t change when only tokens after t change?

For every cut t the probe changes (a) only token t+1 and (b) only the tokens from t+2 on,
and compares the outputs at positions <= t with the clean ones, all in one batched forward.
A correct causal model gives identical outputs (up to float noise); a missing mask, a mask
filled with 0 or an off-by-one mask (each position sees the next token; or the diagonal is
masked too, so the first query has no key left and spreads over every key) changes them.

Whether a leak is a bug depends on what the model is meant to be. It is an error when the
caller says causal=True, or when the model declares itself causal (a model attribute
is_causal=True, the reference model's cfg.is_causal, a Hugging Face config.is_decoder, an
attention module with is_causal=True, or a *ForCausalLM / *LMHeadModel class). It is information
when the model is declared bidirectional (causal=False skips the test; is_causal=False on the
model or its cfg; a Hugging Face model that declares no causality is an encoder by its library's
own design). When nothing declares intent and the outputs are shaped like a language model's
(one score per vocabulary entry at every position) it is a warning: most hand-written LMs are
meant to be causal, and a missing mask is the classic bug that lets them cheat.

A model that returns the last position only (nanoGPT's GPT without targets) is read at every
position by diagnose.calling.per_position. One whose output has no position axis at all (a
classifier [B, C]) has nothing per position to compare: when causal=True asks for the test, it reads
the residual stream instead, the last residual block's output [B, T, C] at every position (the
blocks the adapters find), and says so in the evidence (`compared`); otherwise it is skipped.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..adapters import first_tensor, hooks
from ..modes import eval_mode
from ._subject import SAME, Subject, forward, inputs_for, relative_change, token_level
from ._finding import Finding, SkipCheck

NAME = "causal"

_FIX = ("Mask the future keys only, before the softmax: masked = torch.ones(T, T).triu(1).bool(); "
        "scores = scores.masked_fill(masked, float('-inf')) (or torch.finfo(scores.dtype).min). "
        "triu(2) lets each position see the next token; triu(0) also hides the token itself and leaves "
        "the first query no key, so it attends to everything; filling with 0 instead of a large "
        "negative number masks nothing (exp(0) = 1). With F.scaled_dot_product_attention pass is_causal=True.")

_DECLARE = ("Declare what the model is meant to be: --causal (check_model(..., causal=True), or model.is_causal = "
            "True) makes a leak an error; --bidirectional (causal=False, or model.is_causal = False) for a masked "
            "LM or an encoder, which is meant to see the whole sequence.")


# rows of real tokens the leak test changes (each becomes 2T - 2 variants in one forward): enough to see a mask
# that depends on the data, few enough that a 50k-vocabulary LM's logits stay cheap (SmolLM2: 4 rows x 27
# variants x 14 positions x 49,152 logits)
CAUSAL_ROWS = 4


def declared_causal(model: nn.Module) -> bool | None:
    """True/False when the model says whether it is causal, None when it does not say."""
    if isinstance(getattr(model, "is_causal", None), bool):  # the user's own declaration on the model
        return model.is_causal
    cfg = getattr(model, "cfg", None)
    if isinstance(getattr(cfg, "is_causal", None), bool):
        return cfg.is_causal
    if getattr(getattr(model, "config", None), "is_decoder", None) is True:
        return True
    if any(getattr(m, "is_causal", None) is True for m in model.modules()):
        return True
    if type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")):  # Hugging Face naming convention
        return True
    if _is_hf_config(getattr(model, "config", None)):
        return False  # a Hugging Face architecture not declared a decoder is an encoder by design (BERT's MLM)
    return None


def _is_hf_config(cfg) -> bool:
    return any(c.__name__.lower() == "pretrainedconfig" and c.__module__.startswith("transformers")
               for c in type(cfg).__mro__)


def check_causal(subject: Subject, causal: bool | None = None) -> list[Finding]:
    """Findings of the causal-leak test; raises SkipCheck when it cannot run."""
    if causal is False:
        raise SkipCheck("causal=False: the model is meant to be bidirectional")
    declared = declared_causal(subject.model)
    meant = causal is True or declared is True
    ids = subject.rows[:CAUSAL_ROWS]  # [B, T]: a mask's leak is the same on every row; 2T - 2 variants of each
    B, T = ids.shape
    g = subject.generator(1)
    variants, cuts, kinds = [ids], [], []
    for t in range(T - 1):
        nxt = ids.clone()
        nxt[:, t + 1] = subject.different_tokens(ids[:, t + 1], g)
        variants.append(nxt)
        cuts.append(t)
        kinds.append("next")
        if t + 2 < T:
            far = ids.clone()
            far[:, t + 2:] = subject.different_tokens(ids[:, t + 2:], g)
            variants.append(far)
            cuts.append(t)
            kinds.append("later")
    with eval_mode(subject.model), torch.no_grad():
        out = forward(subject.model, subject.info, torch.cat(variants))  # [(1 + V) * B, ...]
    read = "outputs"
    if not token_level(out[:B], ids):
        if causal is not True:
            raise SkipCheck(f"outputs are pooled {tuple(out.shape[1:])}: there is no output per position to test")
        block, out = _stream(subject, torch.cat(variants), ids)  # [(1 + V) * B, T, C]
        read = f"the residual stream after {block} (the outputs are pooled)"
    clean = out[:B]  # [B, T, V]
    leak = {"next": 0.0, "later": 0.0}
    leaking = torch.zeros(T, dtype=torch.bool)
    for i, (t, kind) in enumerate(zip(cuts, kinds)):
        changed = out[(i + 1) * B:(i + 2) * B]
        rel = relative_change(clean, changed)[:, : t + 1]  # [B, t + 1] positions <= t
        leak[kind] = max(leak[kind], float(rel.max()))
        leaking[: t + 1] |= (rel > SAME).any(0)
    if max(leak.values()) <= SAME:
        return []
    evidence = {"max_relative_change_next_token": leak["next"], "max_relative_change_later_tokens": leak["later"],
                "positions_tested": T, "positions_leaking": int(leaking.sum()),
                "first_leaking_position": int(leaking.nonzero()[0, 0]), "threshold": SAME,
                "declared_causal": declared, "compared": read}
    lm_shaped = out.shape[-1] == subject.info.vocab_size or read != "outputs"
    evidence["lm_shaped_outputs"] = lm_shaped
    if not meant and declared is None and lm_shaped:
        return [Finding(NAME, "warning", "Outputs at position t depend on later tokens, and the outputs are a "
                        "language model's (a score per vocabulary entry at every position) with nothing declaring "
                        "the model causal or bidirectional", evidence,
                        "If it is a decoder/LM, its causal mask is missing or wrong: " + _FIX + " " + _DECLARE)]
    if not meant:
        return [Finding(NAME, "info", "Outputs at position t depend on later tokens: the model is bidirectional",
                        evidence, "Expected for an encoder. If the model is meant to be a decoder/LM, its causal "
                        "mask is missing or wrong; re-run with causal=True (--causal). " + _FIX)]
    if leak["later"] <= SAME:
        title = "Causal leak: each position sees the next token (the mask is off by one)"
    else:
        title = "Causal leak: outputs at earlier positions change when later tokens change"
    return [Finding(NAME, "error", title, evidence, _FIX)]


def _stream(subject: Subject, ids: torch.Tensor, example: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(the last residual block's name, its output for each row of ids [N, T])  # [N, T, C]

    For a model whose output has no position axis; SkipCheck, naming the fix, when no block is found."""
    from ..errors import DiagnoseError
    from ..sites import find_heads

    model, info = subject.model, subject.info
    try:
        sites = find_heads(model, example=inputs_for(info, example[:1], None))
        blocks = sites[0].adapter.blocks(model)
    except DiagnoseError as exc:
        raise SkipCheck(f"the model returns no output per position and its residual blocks are not found ({exc}); "
                        "fix: return an output for every position, or name the attention layers "
                        "(--attention-module)") from None
    if not blocks:
        raise SkipCheck("the model returns no output per position and no residual block was found to read instead; "
                        "fix: return an output for every position")
    name, module = blocks[-1]
    seen: list[torch.Tensor] = []

    def keep(_m, _args, out):
        y = first_tensor(out)
        if y is not None:
            seen.append(y.detach().float().cpu())

    with hooks(lambda: module.register_forward_hook(keep)), eval_mode(model), torch.no_grad():
        forward(model, info, ids)
    stream = torch.cat(seen) if seen else None
    if stream is None or stream.dim() != 3 or stream.shape[:2] != ids.shape:
        raise SkipCheck(f"the model returns no output per position and its last block {name} gave "
                        f"{None if stream is None else tuple(stream.shape)}, not [N, T, C]")
    return name, stream
