"""A GPT written after karpathy/minGPT's mingpt/model.py.

Layout (as minGPT names it): transformer.{wte, wpe, drop, h[i], ln_f}, lm_head (not tied);
Block(ln_1, attn, ln_2, mlp = ModuleDict(c_fc, c_proj, act, dropout)) and `mlpf`, a plain lambda
over that ModuleDict (not a module: it closes over the original `mlp`, so a deepcopy of the model
still calls the original's weights); CausalSelfAttention(c_attn, c_proj, attn_dropout, resid_dropout)
always hand-written, masked by its `bias` buffer (tril ones, [1, 1, block_size, block_size], in the
state dict). Config is a CfgNode from GPT.get_default_config(); model_type XOR (n_layer, n_head,
n_embd). GPT.forward(idx, targets=None) -> (logits [B, T, V] for every position, loss or None).
Users save torch.save(model.state_dict(), path) (projects/chargpt does), see save_state_dict.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F


class CfgNode:
    """minGPT's lightweight yacs-like config: attributes, merge_from_dict, to_dict."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def merge_from_dict(self, d: dict) -> None:
        self.__dict__.update(d)

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, CfgNode) else v for k, v in self.__dict__.items()}


class NewGELU(nn.Module):
    """The tanh approximation of GELU (as in OpenAI GPT and BERT)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: CfgNode):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must divide into n_head heads"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v of all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        mask = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()  # batch, sequence, embedding (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    """An unassuming Transformer block."""

    def __init__(self, config: CfgNode):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
            c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
            act=NewGELU(),
            dropout=nn.Dropout(config.resid_pdrop),
        ))
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward, as minGPT writes it

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


_MODEL_TYPES = {  # a few of minGPT's named sizes
    "gpt-mini": dict(n_layer=6, n_head=6, n_embd=192),
    "gpt-micro": dict(n_layer=4, n_head=4, n_embd=128),
    "gpt-nano": dict(n_layer=3, n_head=3, n_embd=48),
}


class GPT(nn.Module):
    """GPT Language Model."""

    @staticmethod
    def get_default_config() -> CfgNode:
        return CfgNode(model_type="gpt", n_layer=None, n_head=None, n_embd=None, vocab_size=None,
                       block_size=None, embd_pdrop=0.1, resid_pdrop=0.1, attn_pdrop=0.1)

    def __init__(self, config: CfgNode):
        super().__init__()
        assert config.vocab_size is not None and config.block_size is not None, "set vocab_size and block_size"
        self.block_size = config.block_size
        type_given = config.model_type is not None
        params_given = all([config.n_layer is not None, config.n_head is not None, config.n_embd is not None])
        assert type_given ^ params_given, "give exactly one of model_type or (n_layer, n_head, n_embd)"
        if type_given:
            config.merge_from_dict(_MODEL_TYPES[config.model_type])
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.embd_pdrop),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)  # (1, t)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (1, t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (b, t, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def make(seed: int = 0, **overrides: Any) -> GPT:
    """A tiny GPT (2 layers, 2 heads, n_embd 32, vocab 64, block 16, minGPT's default 0.1 dropouts)
    in eval mode; overrides go to the CfgNode (e.g. model_type='gpt-nano' with n_layer=None...)."""
    config = GPT.get_default_config()
    config.merge_from_dict(dict(model_type=None, n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    config.merge_from_dict(overrides)
    torch.manual_seed(seed)
    return GPT(config).eval()
