"""check_model: run the wiring checks on a model and collect their findings."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn

from ..errors import ConfigError, DiagnoseError
from ..objectives import require_finite
from ..modes import eval_mode
from ._subject import Subject, forward, model_info, real_rows
from ._causal import check_causal
from ._finding import Finding, Findings, SkipCheck
from ._inputs import check_continuous, input_kind
from ._parts import is_encoder_decoder
from ._padding import check_padding
from ._positions import check_positions
from ._scaling import check_scaling

CHECKS = ("causal", "padding", "scaling", "positions")


def check_model(model: nn.Module, data: Any = None, *, causal: bool | None = None,
                checks: Sequence[str] | None = None, n_examples: int = 8, length: int = 16, seed: int = 0,
                attention_module: str | None = None, n_heads: int | None = None) -> Findings:
    """Run the wiring checks (causal leak, padding leak, scaling, positions) on `model`.

    data: None (random tokens from the model's vocabulary), a Tensor of ids [N, T], or a Mapping /
    object (DataSet, TaskData) with input_ids and optional attention_mask; padding is stripped and
    the longest rows are cut to one length (<= `length`). causal: True (the model must not see
    the future), False (bidirectional: the causal test is skipped) or None (infer: a leak is an
    error when the model declares itself causal, a warning for undeclared LM-shaped outputs,
    information otherwise). attention_module / n_heads name attention layers diagnose cannot find
    by itself (the scaling check needs them).
    Models whose main input is not token ids (ViT's pixel_values, Whisper's input_features) are
    probed with inputs of their own kind (checks/_inputs.py); an encoder-decoder is checked one part
    at a time (checks/_parts.py), its findings titled and its passed/skipped names prefixed
    `encoder.` / `decoder.`. Every check that cannot apply is listed in .skipped with why.
    Returns a list of Finding (a Findings, which also carries .passed, .skipped, .model and
    .to_json() in the diagnose.checks/1 schema). The model is left as it was (training flag,
    weights, no hooks).
    """
    names = list(CHECKS if checks is None else checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ConfigError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    opts = dict(n_examples=n_examples, length=length, seed=seed, attention_module=attention_module, n_heads=n_heads,
                asked=("causal",) if causal is True else ())
    if is_encoder_decoder(model):
        from ._seq2seq import check_encoder_decoder

        return check_encoder_decoder(model, data, names, causal, opts)
    kind = input_kind(model)
    if kind != "input_ids":
        return check_continuous(model, data, names, kind, opts)
    return check_tokens(model, data, names, causal, opts)


def check_tokens(model: nn.Module, data: Any, names: list[str], causal: bool | None, opts: dict[str, Any],
                 skip: dict[str, str] | None = None) -> Findings:
    """The four checks on a model that takes token ids; `skip` names checks not to run, with why."""
    info = model_info(model)
    rows = real_rows(data, info, n=opts["n_examples"], length=opts["length"], seed=opts["seed"])
    subject = Subject(model, info, rows, seed=opts["seed"])
    try:
        with eval_mode(model), torch.no_grad():
            clean = forward(model, info, subject.rows[:1])
    except DiagnoseError:
        raise
    except Exception as exc:  # the model's own error: say what it was fed
        raise DiagnoseError(f"{info.family} failed on probe input_ids {tuple(subject.rows.shape)}: "
                            f"{type(exc).__name__}: {exc}") from None
    require_finite(model, clean, f"on probe input_ids {tuple(subject.rows[:1].shape)}")
    runs = {
        "causal": lambda: check_causal(subject, causal),
        "padding": lambda: check_padding(subject),
        "scaling": lambda: check_scaling(subject, attention_module=opts["attention_module"], n_heads=opts["n_heads"]),
        "positions": lambda: check_positions(subject),
    }
    summary = {**info.to_json(), "n_parameters": sum(p.numel() for p in model.parameters()),
               "probe": {"examples": int(subject.rows.shape[0]), "length": int(subject.rows.shape[1]),
                         "data": "random tokens" if data is None else "given"},
               "causal_requested": causal}
    return run_checks(names, runs, Findings(model=summary), skip, asked=opts.get("asked", ()))


_ASKED = {"causal": "--causal (causal=True)"}


def run_checks(names: list[str], runs: dict[str, Any], result: Findings, skip: dict[str, str] | None = None,
               asked: Sequence[str] = ()) -> Findings:
    """Run each named check, collecting findings, passes and skips (with why) into `result`. A check in
    `asked` (one the caller requested by name: causal=True) that cannot run is also a warning, so that
    --strict fails instead of passing a test that never ran."""
    for name in names:
        if name in (skip or {}):
            result.skipped.append({"check": name, "why": skip[name]})
            why = skip[name]
        else:
            try:
                found = runs[name]()
                why = None
            except SkipCheck as exc:
                why = str(exc)
            except DiagnoseError:
                raise
            except Exception as exc:  # a model that cannot take one probe's inputs (e.g. longer padding)
                why = f"the model raised {type(exc).__name__}: {exc}"
            if why is not None:
                result.skipped.append({"check": name, "why": why})
        if why is not None:
            if name in asked:
                result.append(Finding(name, "warning", f"The {name} check asked for with {_ASKED.get(name, name)} "
                                      "could not run", {"why": why},
                                      "Make the check possible (see why), or drop the request; --strict fails "
                                      "while a requested check does not run."))
            continue
        result.extend(found)
        if not any(f.is_problem for f in found):
            result.passed.append(name)
    return result
