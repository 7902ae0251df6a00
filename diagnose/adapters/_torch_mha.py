"""torch.nn.MultiheadAttention, bare or inside nn.TransformerEncoder / nn.TransformerDecoder.

MHA never calls out_proj as a module and never shows per-head outputs, so a forward hook
recomputes the attention in Python from the module's own weights (with its masks, bias_k /
bias_v and add_zero_attn) to expose per-head probabilities and outputs; the gate returns the
recomputed output. In eval under no_grad, TransformerEncoder(Layer) and MHA take a fused
fast path that skips the module call entirely: every context here switches it off with
torch.backends.mha.set_fastpath_enabled(False) and restores it in `finally`.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from ._hooks import blocks_around, hooks
from ._probs import LazyProbs
from .base import AttentionSite, HeadOutputFn, PatternCallback, hand_over
from .layout import ProjectionLayout
from .readout import ResidualPath


_FASTPATH_LOCK = threading.Lock()
_fastpath_users = 0  # how many no_fastpath() blocks are open now
_fastpath_before = True  # the switch as the first of them found it


@contextmanager
def no_fastpath() -> Iterator[None]:
    """Force the Python path of MHA / TransformerEncoder for the duration.

    Counted, not saved per block: the monitor opens one block for its attention watch and another for
    head importance, and leaves them in the order its steps end, not always the reverse of the order it
    opened them. Saving per block, the first one left restored the switch and the second one then put
    back its own "before", False, so a monitored nn.TransformerEncoder left the fast path off for the
    rest of the process. The last block left restores what the first one found."""
    global _fastpath_users, _fastpath_before
    with _FASTPATH_LOCK:
        if _fastpath_users == 0:
            _fastpath_before = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
        _fastpath_users += 1
    try:
        yield
    finally:
        with _FASTPATH_LOCK:
            _fastpath_users -= 1
            if _fastpath_users == 0:
                torch.backends.mha.set_fastpath_enabled(_fastpath_before)


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """MHA masks: bool True means 'may not attend' (-inf); float masks are added."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def _inputs(m: nn.MultiheadAttention, query, key, value, key_padding_mask=None, need_weights=True,
            attn_mask=None, average_attn_weights=True, is_causal=False):
    """What the module's softmax sees: (q / sqrt(D), k, v, each [B, H, T, D]; additive masks, each
    broadcastable to [B, H, Tq, Tk]: the attention mask, then the key padding mask)."""
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query[None], key[None], value[None]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
    elif not m.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # [B, T, E]
    B, Tq, E = query.shape
    H, D = m.num_heads, m.head_dim
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.chunk(3)
    q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)  # [B, T, E]
    attn_mask = _float_mask(attn_mask, q.dtype)  # [Tq, Tk] or [B * H, Tq, Tk]
    key_padding_mask = _float_mask(key_padding_mask, q.dtype)  # [B, Tk]
    extra = []
    if m.bias_k is not None:
        extra.append((m.bias_k.expand(B, 1, E), m.bias_v.expand(B, 1, E)))
    if m.add_zero_attn:
        extra.append((q.new_zeros(B, 1, E), q.new_zeros(B, 1, E)))
    for ek, ev in extra:  # one more key: masks get a zero (allowed) column
        k, v = torch.cat([k, ek], 1), torch.cat([v, ev], 1)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    Tk = k.shape[1]
    q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
    masks = (None if attn_mask is None else (attn_mask.reshape(B, H, Tq, Tk) if attn_mask.dim() == 3 else attn_mask),
             None if key_padding_mask is None else key_padding_mask[:, None, None, :])
    return q / math.sqrt(D), k, v, masks


def lazy_probs(m: nn.MultiheadAttention, *args, **kwargs) -> LazyProbs:
    """The module's probabilities, recomputed by query rows on demand (no [B, H, Tq, Tk] at once)."""
    q, k, _, masks = _inputs(m, *args, **kwargs)
    return LazyProbs(q, k, masks, scale=1.0)


def recompute(m: nn.MultiheadAttention, *args, **kwargs):
    """(probs [B, H, Tq, Tk], per-head outputs [B, Tq, H, D]) as the module computes them."""
    q, k, v, masks = _inputs(m, *args, **kwargs)
    scores = q @ k.transpose(-2, -1)  # [B, H, Tq, Tk]
    for mask in masks:
        if mask is not None:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1)  # [B, H, Tq, Tk]
    dropped = F.dropout(probs, m.dropout, m.training)
    heads = (dropped @ v).transpose(1, 2)  # [B, Tq, H, D]
    return probs, heads


def project(m: nn.MultiheadAttention, heads: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """out_proj of heads [B, Tq, H, D], returned in the layout of the module's output `like`."""
    B, Tq = heads.shape[:2]
    out = F.linear(heads.reshape(B, Tq, -1), m.out_proj.weight, m.out_proj.bias)  # [B, Tq, E]
    if like.dim() == 2:
        return out[0]
    return out if m.batch_first else out.transpose(0, 1)


class MHAAdapter:
    family = "torch-mha"
    compile_safe = True  # watch_pattern_traced: a plain forward hook, which dynamo traces (base.TRACED_HOOKS)

    def site(self, layer: int, name: str, m: nn.MultiheadAttention) -> AttentionSite:
        return AttentionSite(layer, name, m.num_heads, m.head_dim, m, self, out_proj=m.out_proj)

    def layout(self, site: AttentionSite) -> ProjectionLayout:
        """None that prune can cut: MHA holds [q; k; v] in one in_proj_weight [3E, E], but derives the
        head width from the embedding width (E // num_heads), so it cannot run with fewer heads."""
        raise ConfigError(f"heads of the {self.family!r} family cannot be cut: torch's MultiheadAttention ties its "
                          "head count to the embedding width; the heads command still measures them")

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
        return [self.site(i, n, m) for i, (n, m) in enumerate(found)] or None

    @contextmanager
    def watch_pattern(self, site: AttentionSite, callback: PatternCallback) -> Iterator[None]:
        def hook(m, args, kwargs, _out):
            with torch.no_grad():
                probs = lazy_probs(m, *args, **kwargs)
            callback(probs)  # [B, H, Tq, Tk], rows made on demand

        with no_fastpath(), hooks(lambda: site.module.register_forward_hook(hook, with_kwargs=True)):
            yield

    def watch_pattern_traced(self, site: AttentionSite, callback: PatternCallback):
        """watch_pattern in the form dynamo traces into a compiled graph: the same forward hook, without
        the global fast-path switch (a forward with grad, the training step the monitor reads, never
        takes the fast path); forwards without grad are not read, as watch_q_k does for the HF families."""
        def hook(m, args, kwargs, _out):
            if not torch.is_grad_enabled():
                return
            with torch.no_grad():
                probs = lazy_probs(m, *args, **kwargs)
            hand_over(callback, probs, eager=False)  # [B, H, Tq, Tk], rows made on demand

        return hooks(lambda: site.module.register_forward_hook(hook, with_kwargs=True))

    @contextmanager
    def intervene(self, site: AttentionSite, fn: HeadOutputFn) -> Iterator[None]:
        def hook(m, args, kwargs, out):
            _, heads = recompute(m, *args, **kwargs)
            return (project(m, fn(heads), out[0]), *out[1:])

        with no_fastpath(), hooks(lambda: site.module.register_forward_hook(hook, with_kwargs=True)):
            yield

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return blocks_around(model, self.find(model) or [])

    def residual_path(self, model: nn.Module, site: AttentionSite) -> ResidualPath:
        """The head's path from an nn.TransformerEncoder's self-attention to the encoder's output (readout.py):
        a post-norm layer's norm1 and norm2 (the head's own and every later one's; a pre-norm layer puts none
        on the residual stream), then the encoder's final `norm` if it has one."""
        encoder = next((e for e in model.modules() if isinstance(e, nn.TransformerEncoder)
                        and any(getattr(layer, "self_attn", None) is site.module for layer in e.layers)), None)
        if encoder is None:
            raise ConfigError(f"{site.name} is not the self-attention of an nn.TransformerEncoder's layer, so its path "
                              "to the output is not known and direct effects are not measured")
        own = {id(getattr(layer, "self_attn", None)) for layer in encoder.layers}
        if any(isinstance(m, nn.MultiheadAttention) and id(m) not in own for m in model.modules()):
            raise ConfigError(f"{site.name}: the model has attention outside its nn.TransformerEncoder (a decoder's "
                              "cross-attention reads the encoder's output), so a head's path to the output is not "
                              "known and direct effects are not measured")
        if type(encoder).forward is not nn.TransformerEncoder.forward:
            raise ConfigError(f"{type(encoder).__name__} overrides TransformerEncoder.forward, so a head's path to the "
                              "output is not known and direct effects are not measured")
        at = next(l for l, layer in enumerate(encoder.layers) if getattr(layer, "self_attn", None) is site.module)
        norms: list[nn.Module] = []
        for layer in encoder.layers[at:]:
            if type(layer).forward is not nn.TransformerEncoderLayer.forward:
                raise ConfigError(f"{type(layer).__name__} does not run TransformerEncoderLayer.forward, so a head's "
                                  "path to the output is not known and direct effects are not measured")
            if not layer.norm_first:  # post-norm: the change crosses norm1 (after attention), then norm2 (after FF)
                norms += [layer.norm1, layer.norm2]
        norms += [] if encoder.norm is None else [encoder.norm]
        for norm in norms:
            shape = getattr(norm, "normalized_shape", ())
            if not isinstance(norm, (nn.LayerNorm, nn.RMSNorm)) or len(shape) != 1:
                raise ConfigError(f"a norm on {site.name}'s path to the output is a {type(norm).__name__}, not a "
                                  "LayerNorm or RMSNorm over the last dimension, so direct effects are not measured")
        return ResidualPath(tuple(norms), encoder)
