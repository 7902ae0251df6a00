"""Checks on models whose main input is not token ids: images (pixel_values: ViT, CLIP vision)
and audio features (input_features). They are probed with inputs of their own kind (the data's,
else random ones shaped from the config), and each check says whether it applies:

  causal     does not apply: there is no token order to leak from, and an image or audio
             encoder reads all of its input by design.
  padding    does not apply: pixel values and audio features carry no padding mask.
  scaling    applies as for text: the scale is measured inside each attention layer.
  positions  images: whole patches are permuted (patch 0 stays), which permutes the patch tokens
             exactly, so outputs that merely permute (or pooled outputs that do not change) mean
             no position information. Audio: skipped -- frames pass through strided convolutions
             before attention, so a permutation of frames is no permutation of positions.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import DataError, DiagnoseError
from ..objectives import call_model, require_finite
from ..modes import eval_mode
from ._subject import SAME, device_of, in_float64, own_precision_note
from ._finding import Finding, Findings, SkipCheck
from ._parts import part_output
from ._positions import _FIX as _POSITIONS_FIX
from ._positions import N_PERMUTATIONS
from ._scaling import measure_scaling

_WHAT = {"pixel_values": "an image", "input_features": "audio features"}


def input_kind(model: nn.Module) -> str:
    """The name of the model's main input: Hugging Face's main_input_name; else pixel_values for a model
    whose first layer (Conv, Linear or Embedding, in registration order) is a Conv2d (timm's and torchvision's ViTs: a patch embedding) and
    that has no nn.Embedding; else input_ids."""
    name = getattr(model, "main_input_name", None)
    if isinstance(name, str):
        return name
    first = next((m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.Embedding))), None)
    if isinstance(first, nn.Conv2d) and not any(isinstance(m, nn.Embedding) for m in model.modules()):
        return "pixel_values"
    return "input_ids"


def _first_conv(model: nn.Module) -> nn.Conv2d | None:
    return next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)


def _pair(v: Any) -> int | None:
    """An int from an int or a square (h, w) pair (timm keeps sizes as pairs)."""
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == v[1] and isinstance(v[0], int):
        return int(v[0])
    return None


def image_size_of(model: nn.Module) -> int | None:
    """The square image side a model takes: its config's image_size, else the model's own `image_size`
    (torchvision) or its patch embedding's `img_size` (timm)."""
    for owner in (getattr(model, "config", None), model, getattr(model, "patch_embed", None)):
        for name in ("image_size", "img_size"):
            size = _pair(getattr(owner, name, None))
            if size is not None:
                return size
    return None


def patch_size_of(model: nn.Module) -> int | None:
    """The patch side: the config's patch_size, else the first Conv2d whose kernel equals its stride."""
    size = _pair(getattr(getattr(model, "config", None), "patch_size", None))
    if size is not None:
        return size
    conv = _first_conv(model)
    if conv is not None and conv.kernel_size == conv.stride:
        return _pair(tuple(conv.kernel_size))
    return None


def probe_inputs(model: nn.Module, data: Any, kind: str, n: int, seed: int) -> torch.Tensor:
    """Up to n examples of the model's own input kind: the data's, else random from the config."""
    if data is not None:
        x = data if isinstance(data, torch.Tensor) else (
            data.get(kind) if isinstance(data, Mapping) else getattr(data, kind, None))
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise DataError(f"{type(model).__name__} takes {kind}: the check data must hold {kind} as a float tensor")
        return x[:n]
    cfg = getattr(model, "config", None)
    g = torch.Generator().manual_seed(seed)
    side = image_size_of(model) if kind == "pixel_values" else None
    if side is not None:
        conv = _first_conv(model)
        c = getattr(cfg, "num_channels", None) or (conv.in_channels if conv is not None else 3)
        return torch.randn(n, c, side, side, generator=g)  # [n, C, S, S]
    if kind == "input_features" and isinstance(getattr(cfg, "num_mel_bins", None), int):
        frames = 2 * getattr(cfg, "max_source_positions", 1500)  # Whisper's fixed input length
        return torch.randn(n, cfg.num_mel_bins, frames, generator=g)  # [n, mels, frames]
    raise DataError(f"{type(model).__name__} takes {kind} and its config does not give their shape; "
                    f"pass check data holding {kind}")


def _call(model: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    out = part_output(call_model(model, {kind: x.to(device_of(model))})).detach().cpu()  # diagnose.calling
    return out if out.dtype == torch.float64 else out.float()  # float64 kept: the positions test needs it


def check_continuous(model: nn.Module, data: Any, names: list[str], kind: str, opts: dict[str, Any],
                     skip: dict[str, str] | None = None) -> Findings:
    from ._runner import run_checks

    x = probe_inputs(model, data, kind, min(opts["n_examples"], 4), opts["seed"])
    try:
        with eval_mode(model), torch.no_grad():
            clean = _call(model, kind, x)
    except DiagnoseError:
        raise
    except Exception as exc:
        raise DiagnoseError(f"{type(model).__name__} failed on probe {kind} {tuple(x.shape)}: "
                            f"{type(exc).__name__}: {exc}") from None
    require_finite(model, clean, f"on probe {kind} {tuple(x.shape)}")
    what = _WHAT.get(kind, kind)

    def no_causal():
        raise SkipCheck(f"the input is {what}: there is no token order to leak from, and its encoder reads all "
                        "of it by design")

    def no_padding():
        raise SkipCheck(f"{kind} carry no padding mask")

    def positions():
        if kind != "pixel_values":
            raise SkipCheck(f"{kind} pass through strided convolutions before attention: a permutation of "
                            "frames is no permutation of positions")
        return _patch_positions(model, x, opts["seed"])

    runs = {"causal": no_causal, "padding": no_padding, "positions": positions,
            "scaling": lambda: measure_scaling(model, {kind: x[:2].to(device_of(model))},
                                               attention_module=opts["attention_module"], n_heads=opts["n_heads"])}
    summary = {"family": type(model).__name__, "input": kind,
               "n_parameters": sum(p.numel() for p in model.parameters()),
               "probe": {"examples": int(x.shape[0]), "shape": list(x.shape[1:]),
                         "data": "random" if data is None else "given"}}
    return run_checks(names, runs, Findings(model=summary), skip, asked=opts.get("asked", ()))


def _patch_positions(model: nn.Module, x: torch.Tensor, seed: int) -> list[Finding]:
    """Permute whole patches (patch 0 fixed): do outputs merely permute, or not change when pooled?"""
    p = patch_size_of(model)
    n, c, h, w = x.shape
    if not isinstance(p, int) or h % p or w % p:
        raise SkipCheck("the patch size is unknown, so patches cannot be permuted")
    gh, gw = h // p, w // p
    N = gh * gw
    g = torch.Generator().manual_seed(seed * 1000 + 3)
    patches = x.reshape(n, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(n, N, c, p, p)  # [n, N, C, p, p]
    perms = [torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(N - 1, generator=g) + 1])
             for _ in range(N_PERMUTATIONS)]
    shuffled = [patches[:, q].reshape(n, gh, gw, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w) for q in perms]
    # SAME, not SAME_FLOAT64, even in float64: Hugging Face attention takes its softmax in float32
    # (measured: 6e-8 .. 1e-7 on a ViT without positions, against >= 1e-4 for a real position signal)
    threshold = SAME

    def run(net: nn.Module, float64: bool) -> torch.Tensor:
        with eval_mode(net), torch.no_grad():
            return _call(net, "pixel_values", torch.cat([x] + shuffled).to(torch.float64 if float64 else x.dtype))

    out, own = in_float64(model, run)
    out = out.double()
    note = [own_precision_note("positions", own)] if own else []
    clean = out[:n]
    per_token = clean.dim() == 3 and clean.shape[1] in (N, N + 1)
    scale = clean.std().clamp_min(1e-12)
    diffs = []
    for i, q in enumerate(perms):
        tok = q if not per_token or clean.shape[1] == N else torch.cat([torch.zeros(1, dtype=torch.long), q + 1])
        expected = clean[:, tok] if per_token else clean
        diffs.append(float((out[(i + 1) * n:(i + 2) * n] - expected).abs().max() / scale))
    if max(diffs) > threshold:
        return note
    kind = "merely permute with the patches" if per_token else "do not change"
    return note + [Finding("positions", "warning", f"No positional information: outputs {kind} when the patches are "
                    "permuted", {"max_relative_difference": max(diffs), "permutations": N_PERMUTATIONS,
                                 "patches_permuted": N - 1, "threshold": threshold, "per_position_outputs": per_token},
                    _POSITIONS_FIX.replace("token embeddings", "patch embeddings"))]
