"""A small-scale proxy of large-run instabilities (after Wortsman et al. 2023): a byte-level
pre-LN decoder trained on real text that ships with every CPython (the Python Language Reference
in `pydoc_data.topics`, 465 KB of English prose and grammar), with optional qk-layernorm and z-loss.

Tiny on purpose (2 layers, d=64, 4 heads, 64 positions): a run of a few hundred steps takes seconds
on one CPU thread. Attention goes through F.scaled_dot_product_attention, so the monitor reads
the max attention logit from the q and k the adapters rebuild.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def corpus() -> torch.Tensor:
    """The Python Language Reference as bytes.  # [N] uint8 -> long"""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


class ProxyAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, qk_norm: bool, ln_bias: bool = True, softmax: bool = False):
        super().__init__()
        self.n_heads, self.softmax = n_heads, softmax
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        hs = d // n_heads
        self.q_norm = nn.LayerNorm(hs, bias=ln_bias) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(hs, bias=ln_bias) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence, embedding
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))  # (B, nh, T, hs)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.softmax:  # nanoGPT's path without flash attention: the logits exist, masked with -inf
            att = (q @ k.transpose(-2, -1)) * k.shape[-1] ** -0.5  # (B, nh, T, T)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class ProxyBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, qk_norm: bool, ln_bias: bool = True, softmax: bool = False):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=ln_bias), nn.LayerNorm(d, bias=ln_bias)
        self.attn = ProxyAttention(d, n_heads, qk_norm, ln_bias, softmax)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ProxyDecoder(nn.Module):
    """Byte-level decoder: forward(idx [B, T]) -> logits [B, T, 256]."""

    def __init__(self, d: int = 64, n_layers: int = 2, n_heads: int = 4, max_len: int = 64, qk_norm: bool = False,
                 head_bias: bool = True, ln_bias: bool = True, softmax: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(ProxyBlock(d, n_heads, qk_norm, ln_bias, softmax) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d, bias=ln_bias)
        # the loss does not see a shift of all logits, and Adam's per-coordinate steps do not keep it
        # still: without weight decay the logits of bytes the text never holds sink (mean logit -15 to -20
        # by step 2,000) and the mean output row grows; z, set by the bytes that occur, stayed at 5-12 over
        # 2,000 steps in every run that did not blow up, with or without this bias (with Adam eps 1e-15 it
        # creeps up to 22 by step 10,000, the loss still falling: docs/monitor.md)
        self.lm_head = nn.Linear(d, 256, bias=head_bias)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, d)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, 256)


def batches(data: torch.Tensor, steps: int, batch: int, seq: int, seed: int):
    """`steps` batches (x, y) of random windows, the same for every run with this seed."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        w = torch.stack([data[j:j + seq + 1] for j in i.tolist()])  # [B, seq + 1]
        yield w[:, :-1], w[:, 1:]


def train(lr: float, *, qk_norm: bool, z_loss: float, head_bias: bool = True, ln_bias: bool = True,
          eps: float = 1e-8, steps: int = 300, warmup: int = 20, batch: int = 16,
          seq: int = 64, seed: int = 0, monitor_dir=None, every: int = 1, attention_every: int = 5,
          data: torch.Tensor | None = None, softmax: bool = False):
    """Train one proxy with AdamW (no weight decay, Adam's `eps`, linear warmup then constant lr);
    returns (losses [steps] floats, the monitor's alerts as (step, kind) in order; its info events,
    the heads' milestones, are not alerts and are left out).
    ln_bias=False with head_bias=False leaves no bias anywhere, as in Wortsman et al. 2023.
    softmax=True computes the attention with an explicit softmax instead of SDPA."""
    from diagnose.monitor import TrainingMonitor

    torch.manual_seed(seed)
    data = corpus() if data is None else data
    model = ProxyDecoder(max_len=seq, qk_norm=qk_norm, head_bias=head_bias, ln_bias=ln_bias, softmax=softmax)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95), eps=eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    losses, alerts = [], []
    mon = None
    if monitor_dir is not None:
        mon = TrainingMonitor(model, monitor_dir, every=every, attention_every=attention_every, echo=False,
                              on_alert=lambda a: None if a["severity"] == "info" else alerts.append((a["step"], a["kind"])))
    try:
        for x, y in batches(data, steps, batch, seq, seed):
            logits = model(x)  # [B, T, 256]
            loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
            total = loss + z_loss * torch.logsumexp(logits, -1).square().mean() if z_loss else loss
            opt.zero_grad(set_to_none=True)
            total.backward()
            if mon is not None:
                mon.step(loss, optimizer=opt)
            opt.step()
            sched.step()
            losses.append(loss.item())
    finally:
        if mon is not None:
            mon.close()
    return losses, alerts
