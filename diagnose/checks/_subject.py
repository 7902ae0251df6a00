"""What the forward-pass checks share: how to call the model, and real-token rows to probe it with.

Inputs go through diagnose.calling: a model whose forward takes a padding mask (`attention_mask`,
or x-transformers' `mask`) gets {"input_ids": ids [B, T], "attention_mask": mask [B, T]} (1 real,
0 padding), which calling routes to forward's own parameters (TransformerLens's `input`); any other
model gets the ids positionally. Every probe runs in eval
mode (diagnose.modes.eval_mode) under no_grad (dropout would make two identical inputs differ) and
restores the training flag. A `Subject` is the model under check with the real-token rows fed to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import DataError
from ..calling import convention, per_position
from ..io import max_positions_of, vocab_size_of
from ._parts import part_output

# Relative output change (max |delta| / std of the clean outputs) below which two outputs are
# "the same". Float32 reordering noise measured on the test models is ~1e-7..1e-6; the
# smallest real leak measured (freshly initialised test models, std 0.02) is ~2e-2.
SAME = 1e-4
MAX_ROWS_PER_FORWARD = 64


@dataclass
class ModelInfo:
    """What the probes need to know about a model, read from it (no user input needed)."""

    vocab_size: int
    pad_id: int
    max_len: int | None
    keywords: bool  # call with {ids_name: ids, "attention_mask": mask}
    takes_mask: bool
    family: str
    ids_name: str = "input_ids"

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "vocab_size": self.vocab_size, "max_len": self.max_len,
                "pad_id": self.pad_id, "takes_attention_mask": self.takes_mask}


def model_info(model: nn.Module) -> ModelInfo:
    """Vocabulary (from the input embedding), padding id, maximum length and call convention."""
    vocab = vocab_size_of(model)
    if vocab is None:
        # the checks must draw random tokens, so they guess where the model states nothing: the token
        # embedding is registered first in every family we know (tok_emb, wte, word_embeddings)
        emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
        vocab = None if emb is None else int(emb.num_embeddings)
    if vocab is None:
        raise DataError(f"{type(model).__name__} has no nn.Embedding, so its vocabulary is unknown; "
                        "pass data with input_ids to the check")
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    # a decoder's own limit first (seq2seq: the positions the checks' decoder inputs take), then the
    # model's as io reads it (config fields, nanoGPT's block_size, x-transformers' max_seq_len)
    target = getattr(cfg, "max_target_positions", None)
    max_len = int(target) if isinstance(target, int) and not isinstance(target, bool) else max_positions_of(model)
    pad = getattr(cfg, "pad_id", None)
    if pad is None:
        pad = getattr(cfg, "pad_token_id", None)
    # diagnose.calling routes {"input_ids", "attention_mask"} to forward's own parameters
    # (TransformerLens's `input`, nanoGPT's `idx`, x-transformers' `x` and `mask`)
    takes_mask = convention(model).mask is not None
    return ModelInfo(vocab, int(pad) if isinstance(pad, int) else 0, max_len,
                     takes_mask, takes_mask, type(model).__name__)


def device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def inputs_for(info: ModelInfo, ids: torch.Tensor, mask: torch.Tensor | None,
               device: torch.device | None = None) -> Any:
    """The model's inputs for ids [B, T] and an optional mask [B, T] (1 real, 0 padding), on `device`."""
    if device is not None:
        ids, mask = ids.to(device), None if mask is None else mask.to(device)
    if not info.keywords:
        return ids
    out = {info.ids_name: ids}
    if mask is not None and info.takes_mask:
        out["attention_mask"] = mask
    return out


def forward(model: nn.Module, info: ModelInfo, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 logits for ids [N, T], in chunks; the caller holds eval_mode and no_grad.  # [N, T, V] or [N, C]"""
    dev = device_of(model)
    outs = []
    for s in range(0, ids.shape[0], MAX_ROWS_PER_FORWARD):
        chunk = ids[s:s + MAX_ROWS_PER_FORWARD].to(dev)
        m = None if mask is None else mask[s:s + MAX_ROWS_PER_FORWARD].to(dev)
        x = inputs_for(info, chunk, m)
        # a model that returns the last position only (nanoGPT) is read at every position, a
        # prefix at a time, so that the causal and padding checks can compare positions
        logits = per_position(model, x, read=part_output).detach().cpu()
        outs.append(logits if logits.dtype == torch.float64 else logits.float())
    return torch.cat(outs)


def token_level(logits: torch.Tensor, ids: torch.Tensor) -> bool:
    """True when the model returns one output per position ([B, T, ...]), False when pooled."""
    return logits.dim() >= 3 and logits.shape[:2] == ids.shape


def relative_change(clean: torch.Tensor, changed: torch.Tensor) -> torch.Tensor:
    """max |changed - clean| over the last dim, divided by the std of the finite clean outputs.  # [N, ...]

    Entries non-finite in both count as unchanged; finite in one only, as changed (inf).
    """
    finite = torch.isfinite(clean)
    scale = clean[finite].std().clamp_min(1e-12) if int(finite.sum()) > 1 else clean.new_tensor(1.0)
    diff = (changed - clean).abs()
    both_bad = ~finite & ~torch.isfinite(changed)
    diff = torch.where(both_bad, torch.zeros_like(diff), diff.nan_to_num(nan=float("inf")))
    return diff.amax(dim=-1) / scale


def random_tokens(shape: tuple[int, ...], info: ModelInfo, g: torch.Generator) -> torch.Tensor:
    """Random ids in the vocabulary, never the padding id.  # shape, int64"""
    ids = torch.randint(0, info.vocab_size - 1, shape, generator=g)
    return ids + (ids >= info.pad_id).long() if 0 <= info.pad_id < info.vocab_size else ids


def real_rows(data: Any, info: ModelInfo, *, n: int = 8, length: int = 16, seed: int = 0) -> torch.Tensor:
    """Up to n rows of real tokens only (padding removed), all of one length.  # [n, T] int64

    Without data, random tokens. With data (a Tensor of ids, a Mapping or an object with
    input_ids and optional attention_mask), the longest rows are cut to a common length,
    at most `length` and at most the model's max_len.
    """
    cap = min(length, info.max_len) if info.max_len else length
    if data is None:
        return random_tokens((n, cap), info, torch.Generator().manual_seed(seed))
    ids, mask = _ids_and_mask(data)
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise DataError(f"input_ids must be an integer tensor [N, T], got {tuple(ids.shape)} {ids.dtype}")
    if int(ids.max()) >= info.vocab_size or int(ids.min()) < 0:
        raise DataError(f"input_ids must lie in [0, {info.vocab_size}) (the model's vocabulary)")
    mask = torch.ones_like(ids) if mask is None else mask
    lengths = mask.sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)[:n]
    T = min(cap, int(lengths[order].min()))
    if T < 4:
        raise DataError(f"the data's longest {len(order)} rows have only {T} real tokens; the checks need at least 4")
    rows = [ids[i][mask[i] != 0][:T] for i in order.tolist()]
    return torch.stack(rows).long()


def _ids_and_mask(data: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(data, torch.Tensor):
        return data, None
    get = data.get if isinstance(data, Mapping) else (lambda k, d=None: getattr(data, k, d))
    ids = get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise DataError("check data must be a Tensor of ids or hold input_ids [N, T] (and attention_mask)")
    mask = get("attention_mask", None)
    if mask is not None and mask.shape != ids.shape:
        raise DataError(f"attention_mask {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}")
    return ids, mask


@dataclass
class Subject:
    """The model under check, what we know about it, and real-token rows [B, T] to probe it with."""

    model: nn.Module
    info: ModelInfo
    rows: torch.Tensor  # [B, T] int64, no padding
    seed: int = 0

    def generator(self, salt: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1000 + salt)

    def different_tokens(self, ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """Random tokens that differ from `ids` everywhere (and are never padding).  # ids.shape"""
        new = random_tokens(tuple(ids.shape), self.info, g)
        for _ in range(8):
            same = new == ids
            if not bool(same.any()):
                break
            new[same] = random_tokens((int(same.sum()),), self.info, g)
        return new


def float64_copy(model: nn.Module, max_params: int = 50_000_000) -> nn.Module | None:
    """A float64 copy of a small model (tests of exact symmetry need ~1e-15 noise), else None."""
    return _float64_copy(model, max_params)[0]


def _float64_copy(model: nn.Module, max_params: int = 50_000_000) -> tuple[nn.Module | None, str | None]:
    n = sum(p.numel() for p in model.parameters())
    if n > max_params:
        return None, f"the model has {n:,} parameters, too many to copy"
    try:
        import copy

        return copy.deepcopy(model).double(), None
    except Exception as exc:  # noqa: BLE001 - the caller says the check ran in the model's own precision
        return None, f"the model could not be copied ({type(exc).__name__}: {exc})"


def in_float64(model: nn.Module, run: Any) -> tuple[Any, str | None]:
    """run(net, float64) on a float64 copy of the model, else on the model itself in its own precision:
    (the result, None) or (the result, why the copy was not used). A copy whose forward fails (minGPT's
    `mlpf` lambda still calls the original float32 modules) counts as no copy."""
    copy, why = _float64_copy(model)
    if copy is not None:
        try:
            return run(copy, True), None
        except Exception as exc:  # noqa: BLE001 - said by the caller, which runs in the model's own precision
            first = str(exc).splitlines()[0] if str(exc) else ""
            why = f"its float64 copy failed to run ({type(exc).__name__}: {first})"
    return run(model, False), why


def own_precision_note(check: str, why: str) -> "Any":
    """The info finding that says a check ran in the model's own precision, and why."""
    from ._finding import Finding

    return Finding(check, "info", "Ran in the model's own precision, not float64", {"why": why},
                   "Nothing to fix for the result; a model whose forward runs on a float64 copy "
                   "(copy.deepcopy(model).double()) is tested with ~1e-15 noise instead of ~1e-6.")
