"""How diagnose calls a model: one place, read from `forward`'s signature, used by every command
and the library (capture, ablate_heads, info, heads, prune, check, the attention finder).

The inputs diagnose holds for a batch are a Tensor (token ids [B, T] or pixel values
[B, C, H, W]) or a Mapping such as {"input_ids": ids, "attention_mask": mask}. `call(model,
inputs)` passes them the way the model's forward takes them:

- A Tensor is passed positionally: `model(x)` (DESIGN.md's contract).
- A Mapping whose keys all name forward's parameters (or that forward takes as **kwargs while
  naming the main input) is passed as keyword arguments, as before: `model(**inputs)` (Hugging Face).
- Otherwise the main input (`input_ids`, `pixel_values` or `input_features`, else the Mapping's
  first entry) goes to forward's first parameter, positionally when it can be (nanoGPT's
  `forward(idx, targets=None)`, timm's `forward(x)`, x-transformers' `forward(x, **kwargs)`),
  else by that parameter's name; the padding mask (`attention_mask`, 1 = real token) goes to the
  parameter that takes one (`attention_mask`, or `mask` as x-transformers names it); other entries
  go by name (an x-transformers `mask` as bool). A mask the forward has no place for is dropped:
  silently when it is all ones (nothing is lost), else with one note (padded positions are
  still never scored).
- Forward's arguments are bound to its signature before the call, so a model that cannot be
  called this way raises `UsageError` (a TypeError) naming the signature found and the fix,
  instead of a TypeError from deep inside, or a swallowed one.
- What cannot be inferred is said by the user: `use_forward(model, fn)` (or
  `load_model(..., forward=fn)`, the CLI's `--forward module:function`) makes `call` run
  `fn(model, inputs)` instead, with the inputs exactly as diagnose holds them (a Tensor or the
  Mapping above). Like --factory, --forward imports code the user named, never a model folder's.
- torch.compile's OptimizedModule and DDP are read through: the wrapped module's signature counts.

Outputs: `logits(output)` reads a Tensor, a tuple/list's first element (nanoGPT's and minGPT's
`(logits, loss)`) or `.logits`. `last_position_only(logits, inputs)` tells a model whose output
covers only the last position (nanoGPT without targets: [B, 1, V] for T > 1). Such a model is
scored on that position: for task lm, on the token after the last input (`last_position_batch`
cuts each example by one position to make that token its label; ablation.batches.for_last_position
does it for every sweep), and the user is told once (`note_last_position`). The checks, which
compare positions, read every position from the hidden state its head reads (`per_position`).
Each note is a diagnose.notes.Note (a warning; the CLI prints it as one `note:` line).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from .errors import DataError, UsageError
from .notes import note

__all__ = ["Convention", "MAIN_INPUTS", "MASK_NAMES", "call", "call_arguments", "convention", "forward_of",
           "last_position_batch", "last_position_only", "logits", "main_input", "note_last_position",
           "per_position", "use_forward"]

# Names of a batch's main input, in the order they are looked for in a Mapping.
MAIN_INPUTS = ("input_ids", "pixel_values", "input_features", "inputs_embeds")
# Parameters that take a padding mask with 1 (True) = real token, in the order they are preferred.
# (PyTorch's key_padding_mask means the opposite, True = padding, so it is not one of them.)
MASK_NAMES = ("attention_mask", "mask")
_FORWARD_ATTR = "diagnose_forward"
_FIX = ("pass forward=fn (fn(model, inputs) -> output) in Python, or --forward module:function on the "
        "command line, naming a function that calls the model")


@dataclass(frozen=True)
class Convention:
    """What `forward`'s signature says: its first parameter and how it can be passed, the
    parameter that takes the padding mask (None: none), the names it takes by keyword, and
    whether it takes **kwargs. `text` is the signature as shown to the user."""

    first: str | None
    first_positional: bool
    mask: str | None
    keywords: frozenset[str]
    var_keyword: bool
    text: str


def _unwrap(model: nn.Module) -> nn.Module:
    """The module whose forward runs: torch.compile's OptimizedModule and DDP/DataParallel wrap it."""
    for attr in ("_orig_mod", "module"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module) and type(model).__name__ in (
                "OptimizedModule", "DistributedDataParallel", "DataParallel"):
            return _unwrap(inner)
    return model


def convention(model: nn.Module) -> Convention:
    """Read the call convention from `model.forward`'s signature (of the wrapped model under
    torch.compile or DDP, whose own forward takes *args, **kwargs)."""
    fwd = _unwrap(model).forward
    try:
        sig = inspect.signature(fwd)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to read, pass inputs as given
        return Convention(None, True, None, frozenset(), True, "forward(...)")
    P = inspect.Parameter
    params = list(sig.parameters.values())
    named = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
    first = params[0] if params and params[0].kind != P.VAR_KEYWORD else None
    keywords = frozenset(p.name for p in named if p.kind != P.POSITIONAL_ONLY)
    mask = next((n for n in MASK_NAMES if n in keywords), None)
    return Convention(
        first=None if first is None or first.kind == P.VAR_POSITIONAL else first.name,
        first_positional=first is not None and first.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD,
                                                              P.VAR_POSITIONAL),
        mask=mask, keywords=keywords, var_keyword=any(p.kind == P.VAR_KEYWORD for p in params),
        text=f"{type(_unwrap(model)).__name__}.forward{sig}")


def main_input(inputs: Any) -> tuple[str | None, Any]:
    """(name, value) of a batch's main input: the Tensor itself (name None), or the Mapping's
    input_ids / pixel_values / input_features / inputs_embeds, else its first entry."""
    if not isinstance(inputs, Mapping):
        return None, inputs
    for name in MAIN_INPUTS:
        if name in inputs:
            return name, inputs[name]
    for name, value in inputs.items():
        return name, value
    return None, None


def call_arguments(model: nn.Module, inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """The (args, kwargs) that `call` passes for `inputs`, checked against forward's signature."""
    conv = convention(model)
    if not isinstance(inputs, Mapping):
        return _bound(model, conv, (inputs,), {})
    name, value = main_input(inputs)
    by_name = all(k in conv.keywords for k in inputs) or (conv.var_keyword and (name in conv.keywords
                                                                                 or conv.first is None))
    if name is None or by_name:  # forward(**kwargs) and forward(*args, **kwargs) too: the names are its own
        return _bound(model, conv, (), dict(inputs))
    rest = {k: v for k, v in inputs.items() if k != name}
    kwargs: dict[str, Any] = {}
    mask = rest.pop("attention_mask", None)
    if mask is not None:
        if conv.mask is not None:
            kwargs[conv.mask] = mask if conv.mask == "attention_mask" else mask.bool()  # x-transformers: bool
        elif conv.var_keyword:
            kwargs["attention_mask"] = mask
        else:
            _drop_mask(conv, mask)
    kwargs.update(rest)
    if conv.first_positional:
        return _bound(model, conv, (value,), kwargs)
    if conv.first is None:
        raise UsageError(f"cannot call {conv.text}: it takes no parameter for {name}; {_FIX}")
    return _bound(model, conv, (), {conv.first: value, **kwargs})


def _bound(model: nn.Module, conv: Convention, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    try:
        inspect.signature(_unwrap(model).forward).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        if conv.text == "forward(...)" and isinstance(exc, ValueError):
            return args, kwargs  # no signature to bind against
        given = ", ".join([type(a).__name__ for a in args] + list(kwargs))
        raise UsageError(f"cannot call {conv.text} with ({given}): {exc}; {_FIX}") from None
    return args, kwargs


def _drop_mask(conv: Convention, mask: Any) -> None:
    if isinstance(mask, torch.Tensor) and bool((mask != 0).all()):
        return  # no padding: the mask says nothing the model does not already assume
    # warnings shows a message once per place (its default filter), so a sweep warns once, not per batch
    note(f"{conv.text} takes no padding mask, so the data's attention_mask is not passed: padded positions "
         "are never scored, but a model that is not causal reads them; drop the padding from the data, or pass "
         "forward= / --forward to give the model its mask", stacklevel=4)


def use_forward(model: nn.Module, fn: Callable[[nn.Module, Any], Any] | None) -> nn.Module:
    """Make `call` run fn(model, inputs) for this model (None: back to reading forward's signature).

    For a model whose calling convention cannot be read from its signature (a forward that takes
    its inputs in a dict, needs extra arguments, or whose output is not its logits). Returns the model.
    """
    if fn is not None and not callable(fn):
        raise UsageError(f"forward= must be a function fn(model, inputs) -> output, not a {type(fn).__name__}")
    if fn is None:
        model.__dict__.pop(_FORWARD_ATTR, None)
    else:
        model.__dict__[_FORWARD_ATTR] = fn
    return model


def forward_of(model: nn.Module) -> Callable[[nn.Module, Any], Any] | None:
    """The function given with use_forward (or forward= / --forward), if any."""
    return _unwrap(model).__dict__.get(_FORWARD_ATTR) or model.__dict__.get(_FORWARD_ATTR)


def call(model: nn.Module, inputs: Any) -> Any:
    """Run the model on `inputs` (a Tensor, or a Mapping as described above); its raw output."""
    fn = forward_of(model)
    if fn is not None:
        return fn(model, inputs)
    args, kwargs = call_arguments(model, inputs)
    return model(*args, **kwargs)


def logits(output: Any) -> torch.Tensor:
    """A model's output: a Tensor, a tuple/list (first element: `(logits, loss)`), or an object with .logits."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise DataError(f"cannot find logits in a model output of type {type(output).__name__}; pass forward= / "
                    "--forward with a function that returns the logits")


def last_position_only(out: torch.Tensor, inputs: Any) -> bool:
    """True when token ids [B, T > 1] gave outputs for the last position only ([B, 1, V])."""
    _, ids = main_input(inputs)
    return (isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
            and ids.shape[1] > 1 and out.dim() == 3 and tuple(out.shape[:2]) == (ids.shape[0], 1))


def _prefix(inputs: Any, shape: torch.Size, t: int) -> Any:
    """The inputs cut to their first t positions (every tensor whose [B, T] is the ids')."""
    if not isinstance(inputs, Mapping):
        return inputs[:, :t]
    return {k: (v[:, :t] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[:2] == shape else v)
            for k, v in inputs.items()}


def per_position(model: nn.Module, inputs: Any, read: Callable[[Any], torch.Tensor] | None = None) -> torch.Tensor:
    """The model's output at every position.  # [B, T, ...], or the model's own shape ([B, C] pooled)

    For a model that returns the last position only (see last_position_only) this is the output
    of the last submodule to finish with one value per position, [B, T, C]: the hidden state the
    head reads (nanoGPT's ln_f), so that tests comparing positions (a causal leak, padding) still
    see every position (calls on prefixes would hide any leak: a prefix has no future). The user
    is told once which module was read. `read` takes the tensor from the output (default: `logits`).
    """
    from .adapters import hooks

    read = read or logits
    out = read(call(model, inputs))
    if not last_position_only(out, inputs):
        return out
    _, ids = main_input(inputs)
    seen: list[tuple[str, torch.Tensor]] = []

    def keep(name: str):
        def hook(_m, _args, o):
            if isinstance(o, torch.Tensor) and o.dim() >= 3 and o.shape[:2] == ids.shape and o.is_floating_point():
                seen.append((name, o))
        return hook

    regs = [lambda m=m, n=n: m.register_forward_hook(keep(n)) for n, m in model.named_modules() if m is not model]
    with hooks(*regs):
        call(model, inputs)
    if not seen:
        raise DataError(f"{type(_unwrap(model)).__name__} returns the last position only ({tuple(out.shape)}) and "
                        "no submodule gives one value per position; pass forward= / --forward with a function "
                        "that returns the logits at every position")
    name, hidden = seen[-1]
    note(f"{type(_unwrap(model)).__name__} returns logits for the last position only, so every position is read "
         f"from {name!r}, the last module with one output per position")
    return hidden


def last_position_batch(inputs: Any, labels: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
    """A language-model batch for a model that predicts only after its last input: the inputs
    without their last position, and as labels [B, 1] the token that follows (IGNORE where it is
    padding). Given labels [B, T] (aligned with the positions) keep the one at the new last position."""
    from .objectives import IGNORE

    name, ids = main_input(inputs)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 2:
        raise DataError("a model that predicts only after its last input needs token ids [B, T] with T >= 2")
    cut = _prefix(inputs, ids.shape, ids.shape[1] - 1)
    if labels is not None and labels.dim() == 2:
        return cut, labels[:, -2:-1]
    if labels is not None:
        return cut, labels
    target = ids[:, -1:].clone()  # [B, 1]
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if isinstance(mask, torch.Tensor):
        target[mask[:, -1:] == 0] = IGNORE
    return cut, target


def note_last_position(model: nn.Module) -> str:
    """Tell the user (a diagnose.notes.Note, shown once per model class) that only the last position
    is scored; returns the line."""
    line = (f"{type(_unwrap(model)).__name__} returns logits for the last position only ([B, 1, V]), so it is "
            "scored there: on the token after each example's last input (the inputs are cut by one position)")
    note(line, stacklevel=3)
    return line
