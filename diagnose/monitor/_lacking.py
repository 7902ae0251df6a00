"""Which signals a run lacks, and why: every record key the registered measurements declare
(`Measurement.keys`) that no logged record of the run carries, with the reason the monitor
could not measure it there and the alert kinds that therefore cannot fire.

A key is carried when some record holds a number (or a list of numbers) under it; `layers.*.x`
and `attention.*.x` in any block or site. Keys written only on an event (clip_coef when the loop
clips, nonfinite_param at a NaN) are not signals a run can lack.
"""

from __future__ import annotations

from typing import Any

from ._measure import MEASUREMENTS

ON_EVENT = frozenset({"clip_coef", "nonfinite_param"})  # written when the event happens, not every step

_NO_SITE = ("no attention site was found: no adapter recognises this model's attention "
            "(`diagnose check` names the families it knows)")
_NOT_SAMPLED = ("attention is sampled every {every} steps and no logged step was one of them "
                "(TrainingMonitor(attention_every=N) samples it; 0 turns it off)")
_REASONS = {
    "attention.*.max_logit": ("the adapter of this model's attention hands over the probabilities only, not the "
                              "pre-softmax logits (a fused kernel other than SDPA, need_weights of "
                              "nn.MultiheadAttention, a hook on the pattern), so attention_logit_growth cannot fire"),
    "z_mean": ("the model's output is not a [batch, positions, vocabulary] float tensor (nor its `.logits`, nor a "
               "tuple's first): a classifier's or an encoder's, so logit_divergence cannot fire"),
    "layers.*.update_ratio": ("step() was not given the optimizer (mon.step(loss, optimizer=opt)), or no logged "
                              "step came right after an attention step, so update_size cannot fire"),
    "layers.*.adam_rms_v_eps": ("the optimizer keeps no Adam second moment (exp_avg_sq), or step() was not given "
                                "it, so adam_eps cannot fire"),
    "icl_early": ("the model's output is not next-token logits [batch, positions, vocabulary] over its input ids' "
                  "positions (a classifier's, an encoder's, or inputs without token ids), so the in-context score "
                  "and induction_phase_change cannot be measured"),
    "grad_norm": "no parameter had a gradient at step(): call it after backward(), before zero_grad()",
    "layers.*.grad_norm": "no block's parameters had a gradient at step()",
}


def _carried(records: list[dict[str, Any]], key: str) -> bool:
    part, _, field = key.partition(".*.")
    if not field:
        return any(_number(r.get(key)) for r in records)
    return any(_number(st.get(field)) for r in records for st in (r.get(part) or {}).values()
               if isinstance(st, dict))


def _number(x: Any) -> bool:
    if isinstance(x, list):
        return any(_number(v) for v in x)
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_COMPILED = ("the model ran under torch.compile on torch {torch}, whose dynamo cannot trace the scores' hand-over "
             "(torch >= 2.13 does), so attention_logit_growth cannot fire; fix: torch >= 2.13, or sample from an "
             "eager run")


_COMPILED_HEADS = ("the model ran under torch.compile, where the per-head importance, the role shares and the "
                   "in-context loss are not sampled (their hooks on the heads' outputs and on the output logits "
                   "would break or multiply the graphs), so the head events (induction_phase_change and the "
                   "heads' own) cannot fire; fix: sample them from an eager run of the model")
_COMPILED_LACKS = ("heads", "icl")  # the measurements a compiled run never samples (_head_importance.py)


def _old_torch(version: Any) -> bool:
    try:
        major, minor = (int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 13)


def _reason(key: str, measurement: str, records: list[dict[str, Any]], info: dict[str, Any]) -> str:
    model = info.get("model") or {}
    if measurement in _COMPILED_LACKS and model.get("compiled"):
        return _COMPILED_HEADS
    if key == "attention.*.max_logit" and model.get("compiled") and _old_torch(model.get("torch")):
        return _COMPILED.format(torch=model.get("torch"))
    if key.startswith("attention."):
        if not (info.get("model") or {}).get("attention_sites"):
            return _NO_SITE
        if not _carried(records, "attention.*.entropy"):
            return _NOT_SAMPLED.format(every=(info.get("settings") or {}).get("attention_every", "?"))
    if key in _REASONS:
        return _REASONS[key]
    if key in ("z_abs_max", "z_sq_mean"):
        return _REASONS["z_mean"]
    if key.startswith("layers.") and not (info.get("model") or {}).get("blocks"):
        return "no residual block was found in the model"
    return f"no logged record carries it: the probe of the measurement {measurement!r} wrote nothing"


def lacking_signals(run: Any) -> list[dict[str, Any]]:
    """[{"measurement", "keys", "reason"}]: per registered measurement, the declared record keys this
    run's records never carry and why (the first such key's reason). run: a read_run Run; empty when
    every signal was recorded, or when the run logged no step."""
    records = list(run.records)
    if not records:
        return []
    out = []
    for m in MEASUREMENTS:
        keys = [k for k in m.keys if k not in ON_EVENT and not _carried(records, k)]
        if keys:
            out.append({"measurement": m.name, "keys": keys, "reason": _reason(keys[0], m.name, records, run.info)})
    return out + _site_gaps(records, run.info, {k for x in out for k in x["keys"]})


def _site_gaps(records: list[dict[str, Any]], info: dict[str, Any], lacked: set[str]) -> list[dict[str, Any]]:
    """A signal some attention sites record and others not (run.json's "signals", _declare.py): the
    sites without it, with the reason (one adapter hands the logits over, another only the probabilities)."""
    sites = ((info.get("signals") or {}).get("attention")) or {}
    out = []
    for m in MEASUREMENTS:
        for key in m.keys:
            part, _, field = key.partition(".*.")
            missing = [s for s, have in sites.items() if field not in have] if part == "attention" else []
            if missing and key not in lacked:
                out.append({"measurement": m.name, "keys": [f"attention.{s}.{field}" for s in missing],
                            "reason": _reason(key, m.name, records, info)})
    return out


def lacking_lines(run: Any) -> list[str]:
    """lacking_signals as text, one line per measurement: what `diagnose stats` prints."""
    return [f"not recorded: {', '.join(x['keys'])} -- {x['reason']}" for x in lacking_signals(run)]
