"""The planted circuits of planted.py in other layouts: GPT-2 (fused Conv1D [q; k; v] stored [in, out]),
the hand-written nanoGPT-style model of tests/nano.py (no adapter: the generic probe), and a LLaMA with
grouped-query attention (separate q/k/v projections, RMSNorm, rotary positions, 2 query heads sharing
1 key/value head; in "relay" its SwiGLU MLP relays as the reference's GELU one does).

GPT-2 and nanoGPT are the reference model's weights copied over, module for module (both are pre-norm
with learned positions; MLPs at 0, but GPT-2's in "relay", copied too, with the reference's exact GELU).
LLaMA has no position embedding, so its previous-token head is set by hand through the rotary angles: query and key read the constant pair onto rotary pair ROPE_PAIR (angle
theta per position), the key turned back by one position, so that the score A cos(theta (s - t + 1)) peaks
at key s = t - 1 (theta 0.56: the next peak is 11 positions away, past the sequence). The later heads'
content queries and keys sit on the slowest pairs (angle <= 0.01 a position), where the rotation is
about 1, so they match by content as in the reference model. Its sigma is the reference's (the +/- pairs
have mean 0, so RMSNorm's rms is LayerNorm's sigma).
"""

from __future__ import annotations

import math

import torch

from .planted import BACKUP, BIG, D_MODEL, FIRE, GAIN, PAIRS, SHARP, T, THRESHOLD, V, pair, planted, _read, _write

ROPE_PAIR = 1  # the rotary pair of the previous-token head: angle 10000 ** (-1 / 16) = 0.56 a position
SLOW = 8  # the first of the slow rotary pairs (angle <= 10000 ** (-8 / 16) = 0.01), for content
HEAD_DIM = 32
LARGE = 20.0  # the LLaMA relay's offset unit: silu(20) is 20 to float32's precision


def gpt2(kind: str = "induction"):
    """The planted reference model's weights in a GPT-2 (untied unembedding, eager attention)."""
    import transformers

    ref = planted(kind)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=D_MODEL, vocab_size=V, n_positions=T, bos_token_id=0,
                                  eos_token_id=0, attn_implementation="eager", resid_pdrop=0, embd_pdrop=0,
                                  attn_pdrop=0, tie_word_embeddings=False, activation_function="gelu")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        t = model.transformer
        t.wte.weight.copy_(ref.tok_emb.weight)
        t.wpe.weight.copy_(ref.pos_emb.weight)
        for block, src in zip(t.h, ref.blocks):
            _norms((block.ln_1, block.ln_2), (src.ln1, src.ln2))
            block.attn.c_attn.weight.copy_(src.attn.qkv.weight.T)  # Conv1D: [in, out]
            block.attn.c_proj.weight.copy_(src.attn.proj.weight.T)
            for dst, w in ((block.mlp.c_fc, src.mlp.fc), (block.mlp.c_proj, src.mlp.proj)):
                dst.weight.copy_(w.weight.T)
                dst.bias.copy_(w.bias)
        _norms((t.ln_f,), (ref.ln_f,))
        model.lm_head.weight.copy_(ref.head.weight)
    return model


def nano(kind: str = "induction"):
    """The planted reference model's weights in the hand-written nanoGPT-style model (tests/nano.py)."""
    from ..nano import NanoGPT

    ref = planted(kind)
    model = NanoGPT(vocab=V, d=D_MODEL, n_heads=2, n_layers=2, max_len=T).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.wte.weight.copy_(ref.tok_emb.weight)
        model.wpe.weight.copy_(ref.pos_emb.weight)
        for block, src in zip(model.h, ref.blocks):
            _norms((block.ln_1, block.ln_2), (src.ln1, src.ln2))
            block.attn.c_attn.weight.copy_(src.attn.qkv.weight)
            block.attn.c_proj.weight.copy_(src.attn.proj.weight)
        _norms((model.ln_f,), (ref.ln_f,))
        model.lm_head.weight.copy_(ref.head.weight)
    return model


def _norms(dst, src) -> None:
    for d, s in zip(dst, src):
        d.weight.copy_(s.weight)
        d.bias.copy_(s.bias)


def llama(kind: str = "induction"):
    """The planted circuit set by hand in a LLaMA with grouped-query attention (2 query heads sharing 1
    key/value head): every kind of planted.py, on its sequences and labels (planted.planted_data). In
    "backup" the two induction query heads share the key/value head, so L0.H0 -> L1.H0 (k) feeds both."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=D_MODEL, intermediate_size=8, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, vocab_size=V,
                                   max_position_embeddings=T, attn_implementation="eager", rope_theta=10000.0,
                                   tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = transformers.LlamaForCausalLM(cfg).eval()
    sigma = BIG * (2 / D_MODEL) ** 0.5
    sharp = SHARP * HEAD_DIM ** 0.5 * sigma
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        m = model.model
        for norm in (*(b.input_layernorm for b in m.layers), *(b.post_attention_layernorm for b in m.layers), m.norm):
            norm.weight.fill_(1.0)
        m.embed_tokens.weight[:, pair("C")], m.embed_tokens.weight[:, pair("C") + 1] = BIG, -BIG
        for t in range(V):
            _write(m.embed_tokens.weight.T, t, "TOK", t, 1.0)
        _positional(m.layers[0].self_attn, 0, 1, sigma)
        _head_out(m.layers[0].self_attn, 0, "TOK", "PREV", 1.0, sigma)
        a1 = m.layers[1].self_attn
        q_space, k_space, v_space = {"induction": ("TOK", "PREV", "TOK"), "q": ("PREV", "TOK", "TOK"),
                                     "v": (None, None, "PREV"), "backup": ("TOK", "PREV", "TOK"),
                                     "relay": ("TOK", "PREV", "TOK")}[kind]
        for head, gain in ((0, 1.0), (1, BACKUP)) if kind == "backup" else ((0, 1.0),):
            if q_space is None:
                _positional(a1, head, 0, sigma)  # attends to itself
            for i in range(V if q_space else 0):  # content on the slow pairs: dimension SLOW + i of the head
                _read(a1.q_proj.weight, head * HEAD_DIM + SLOW + i, q_space, i, sharp / sigma)
                _read(a1.k_proj.weight, SLOW + i, k_space, i, sigma)  # the one key/value head
            _head_out(a1, head, v_space, "RELAY" if kind == "relay" else "OUT", gain, sigma)
        if kind == "relay":
            _swiglu_relay(m.layers[1].mlp, sigma)
        for t in range(V):
            _read(model.lm_head.weight, t, "OUT", t, GAIN * sigma)
    return model


def _swiglu_relay(mlp, sigma: float) -> None:
    """planted.py's relay in LLaMA's MLP, down(silu(gate x) * up x), without biases: unit t's gate reads
    FIRE * RELAY_t - THRESHOLD (the threshold off the constant pair), its up the constant 1; unit V's gate
    a constant LARGE, so that it writes the offset that a bias would."""
    silu = torch.nn.functional.silu
    on, off = (float(silu(torch.tensor(x))) for x in (FIRE - THRESHOLD, -THRESHOLD))
    c = sigma / BIG  # reads the constant pair as 1
    for t in range(V):
        _read(mlp.gate_proj.weight, t, "RELAY", t, FIRE * sigma)
        _read(mlp.gate_proj.weight, t, "C", 0, -THRESHOLD * c)
        _read(mlp.up_proj.weight, t, "C", 0, c)
        _write(mlp.down_proj.weight, t, "OUT", t, 1 / (on - off))
    _read(mlp.gate_proj.weight, V, "C", 0, LARGE * c)
    _read(mlp.up_proj.weight, V, "C", 0, c)
    for t in range(V):
        _write(mlp.down_proj.weight, V, "OUT", t, -off / (on - off) / float(silu(torch.tensor(LARGE))))


def _positional(attn, head: int, shift: int, sigma: float) -> None:
    """Query head `head` attends `shift` positions back (0: to itself) by the rotary angles (module docstring):
    its query and the shared key read the constant pair, the key turned back by shift positions."""
    theta = 10000.0 ** (-2 * ROPE_PAIR / HEAD_DIM)
    amplitude = 2 * SHARP * HEAD_DIM ** 0.5 / (1 - math.cos(theta))  # the peak beats the next key by 2 SHARP
    half, c, scale = HEAD_DIM // 2, pair("C"), amplitude ** 0.5 / (BIG / sigma)
    for row, q, k in ((ROPE_PAIR, 1.0, math.cos(shift * theta)), (ROPE_PAIR + half, 0.0, math.sin(shift * theta))):
        attn.q_proj.weight[head * HEAD_DIM + row, c] = q * scale
        attn.k_proj.weight[row, c] = k * scale


def _head_out(attn, head: int, value: str, out: str, gain: float, sigma: float) -> None:
    """The shared value head reads `value`; query head `head` writes what it reads onto `out`, times gain."""
    for t in range(V):
        _read(attn.v_proj.weight, t, value, t, sigma)
        _write(attn.o_proj.weight, head * HEAD_DIM + t, out, t, gain)


__all__ = ["gpt2", "nano", "llama", "PAIRS"]
