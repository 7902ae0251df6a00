"""A GPT written after karpathy/nanoGPT's model.py, and the files its train.py and prepare.py write.

Layout (as nanoGPT names it): transformer.{wte, wpe, drop, h[i], ln_f}, lm_head (tied to wte);
Block(ln_1, attn, ln_2, mlp); CausalSelfAttention(c_attn, c_proj, attn_dropout, resid_dropout),
with F.scaled_dot_product_attention(is_causal=True) when `flash`, else the hand-written softmax
masked by the `bias` buffer (tril ones, [1, 1, block_size, block_size]) that only that path registers.
nanoGPT sets flash = hasattr(F, 'scaled_dot_product_attention'); here it is GPTConfig.flash so a
test can take either path. GPT.forward(idx, targets=None) -> (logits, loss): with targets, logits
[B, T, V] and the mean cross-entropy; without, logits of the LAST position only, [B, 1, V], and None.

What a nanoGPT user holds after training (see save_like_train_py, write_val_bin):
    out/ckpt.pt        torch.save({'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config'});
                       train.py compiles by default, so 'model' keys start with '_orig_mod.'
    data/<name>/val.bin  raw uint16 token ids (np.uint16 .tofile), read back with np.memmap
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")  # train.py's model_args


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's own: nn.LayerNorm could not drop the bias)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must divide into n_head heads"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v of all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.flash = config.flash
        if not self.flash:
            mask = torch.tril(torch.ones(config.block_size, config.block_size))
            self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()  # batch, sequence, embedding (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    flash: bool = True  # ours: nanoGPT decides this from the torch version


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: both keys stay in the state dict
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

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence length {t} > block size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (t)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (b, t, vocab)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # (b, 1, vocab): inference looks at the last position only
            loss = None
        return logits, loss


TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)


def make(seed: int = 0, **overrides: Any) -> GPT:
    """A tiny GPT (2 layers, 2 heads, n_embd 32, vocab 64, block 16) in eval mode; overrides go to
    GPTConfig (flash=False for the hand-written softmax, or any of the model_args)."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


def save_like_train_py(model: GPT, path: str | Path, *, compiled: bool = True, iter_num: int = 250,
                       val_loss: float = 3.9) -> Path:
    """Write `path` as nanoGPT's train.py writes out/ckpt.pt. train.py saves raw_model.state_dict()
    where raw_model is the torch.compile'd model, hence the '_orig_mod.' prefixes (compiled=True,
    its default); best_val_loss is a 0-dim tensor (estimate_loss's mean); the optimizer is AdamW
    with configure_optimizers' two groups, after one step (its state holds exp_avg/exp_avg_sq)."""
    c = model.config
    model_args = {k: getattr(c, k) for k in MODEL_ARGS}
    raw_model = torch.compile(model) if compiled else model  # compiles nothing until called
    checkpoint = {
        "model": raw_model.state_dict(),
        "optimizer": _adamw_state(model),
        "model_args": model_args,
        "iter_num": iter_num,
        "best_val_loss": torch.tensor(val_loss),
        "config": {**_TRAIN_CONFIG, **model_args, "compile": compiled},
    }
    torch.save(checkpoint, path)
    return Path(path)


_TRAIN_CONFIG = dict(out_dir="out", eval_interval=250, log_interval=10, eval_iters=200, eval_only=False,
                     always_save_checkpoint=False, init_from="scratch", wandb_log=False, dataset="shakespeare_char",
                     gradient_accumulation_steps=1, batch_size=64, learning_rate=1e-3, max_iters=5000,
                     weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0, decay_lr=True, warmup_iters=100,
                     lr_decay_iters=5000, min_lr=1e-4, backend="nccl", device="cpu", dtype="float32")


def _adamw_state(model: GPT) -> dict:
    """configure_optimizers' AdamW (decay for >= 2-d weights) stepped once on zero gradients of copies,
    so the model itself is untouched."""
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    for p in params.values():
        p.grad = torch.zeros_like(p)
    groups = [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    optimizer.step()
    return optimizer.state_dict()


def load_like_sample_py(path: str | Path, **config_overrides: Any) -> GPT:
    """What nanoGPT's sample.py does with ckpt.pt: GPTConfig(**model_args), strip '_orig_mod.', load."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**checkpoint["model_args"], **config_overrides))
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k in list(state_dict):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    return model.eval()


def write_val_bin(path: str | Path, ids) -> Path:
    """Token ids as nanoGPT's data/*/prepare.py writes train.bin/val.bin: raw np.uint16, no header."""
    np.array(ids, dtype=np.uint16).tofile(path)
    return Path(path)


def get_batch(path: str | Path, block_size: int, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """What the user then does (train.py's get_batch): memmap the uint16 file, take random windows,
    and cast to int64. Returns x, y: [batch_size, block_size] int64, y shifted one token on."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=torch.Generator().manual_seed(seed))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix.tolist()])
    return x, y
