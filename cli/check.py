"""`diagnose check`: wiring bugs -- causal leak, padding leak, attention scaling, positions."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.text import Text

from diagnose.display import plain

from ._options import attention_options, check_outputs, data_option, max_length_option, model_options

_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}


@click.command()
@model_options
@data_option(required=False)
@max_length_option
@attention_options
@click.option("--causal/--bidirectional", "causal", default=None,
              help="The model must not see the future (--causal: a leak is an error) or is meant to see the whole "
                   "sequence (--bidirectional: the causal test is skipped). Default: infer from the model -- an "
                   "error when it declares itself causal, a warning for undeclared LM-shaped outputs, "
                   "information otherwise.")
@click.option("--no-causal", "causal", flag_value=False, hidden=True, help="Same as --bidirectional.")
@click.option("--run", "run_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Also check warmup and gradient clipping recorded in this TrainingMonitor run folder.")
@click.option("--json", "json_path", type=click.Path(path_type=str), default=None,
              help="Write the diagnose.checks/1 JSON here (atomically).")
@click.option("--strict", is_flag=True, default=False,
              help="Exit with code 1 when any warning or error is found (default: 0 whatever is found).")
def check(model: str, factory: str | None, forward: str | None, trust_pickle: bool, attn_implementation: str | None,
          data: str | None, max_length: int | None, attention_module: str | None, n_heads: int | None,
          causal: bool | None, run_dir: str | None, json_path: str | None, strict: bool) -> None:
    """Check a model for wiring bugs, each proven by a forward-pass experiment.

    \b
    causal     change tokens after t: do outputs at positions <= t change?
    padding    change padded tokens / add padding: do real outputs change?
    scaling    are attention scores divided by sqrt(d_k)? (plus logit std, saturation)
    positions  permute the tokens: do outputs merely permute (no positions)?

    Without --data the probes use random tokens from the model's vocabulary. Exit code
    0 whatever is found (findings are the output), 1 with --strict when a warning or error
    is found, 2 on bad input.

    \b
    Example: diagnose check demo-out/induction/model.pt --data demo-out/induction/eval.pt
    """
    check_outputs({"--json": json_path}, inputs=[model, data, run_dir])  # before the slow imports
    from diagnose.checks import check_model, check_training_setup
    from diagnose.io import load_data_for, load_model

    net = load_model(model, factory=factory, trust_pickle=trust_pickle, attn_implementation=attn_implementation,
                     forward=forward)
    ds = load_data_for(net, data, max_length=max_length) if data else None
    result = check_model(net, ds, causal=causal, attention_module=attention_module, n_heads=n_heads)
    if run_dir:
        result.merge(check_training_setup(run_dir=run_dir, checks=("warmup", "grad_clipping")))
    result.model["source"] = model
    if json_path:
        result.write_json(json_path)
    _print(result, json_path)
    if strict and result.problems:
        sys.exit(1)


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def _probe_text(probe: dict) -> str:
    if "shape" in probe:  # pixel values or audio features
        return f"{probe.get('examples')} x {probe.get('shape')} inputs ({probe.get('data')})"
    return f"{probe.get('examples')} x {probe.get('length')} tokens ({probe.get('data')})"


def _print(result, json_path: str | None) -> None:
    out = Console(highlight=False)
    m = result.model
    parts = [("encoder", m["encoder"]), ("decoder", m["decoder"])] if m.get("encoder_decoder") else [("", m)]
    probes = "; ".join(f"{part + ' ' if part else ''}probed with {_probe_text(pm.get('probe', {}))}"
                       for part, pm in parts)
    out.print(Text(plain(f"{m.get('family')} ({m.get('n_parameters', 0):,} parameters), {probes}")))
    for f in result:
        out.print(Text.assemble("\n", (f"{f.severity.upper():7}", _STYLE[f.severity]), plain(f" {f.check}: "),
                                (plain(f.title), "bold")))
        for key, value in f.evidence.items():
            out.print(Text(plain(f"    {key} = {_value(value)}")))
        out.print(Text(plain(f"    fix: {f.fix}")))
    out.print()
    problems = result.problems
    if problems:
        out.print(Text(f"{len(problems)} problem(s) found.", style="bold red"))
    else:
        out.print(Text("No wiring problem found.", style="bold green"))
    if result.passed:
        out.print(Text(plain(f"passed: {', '.join(result.passed)}")))
    for s in result.skipped:
        out.print(Text(plain(f"skipped: {s['check']} ({s['why']})")))
    if json_path:
        out.print(Text(plain(f"JSON written to {json_path}")))
