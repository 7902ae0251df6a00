"""`diagnose circuit`: which heads feed which (through queries, keys or values, MLPs, or the output), with intervals."""

from __future__ import annotations

import click

from ._options import (
    batch_size_option,
    min_effect_option,
    attention_options,
    check_outputs,
    data_option,
    finite,
    html_option,
    max_length_option,
    method_option,
    model_options,
)
from .heads import TASKS, parse_methods

ESTIMATORS = ("eap", "eap-ig")  # literal so that --help needs no torch; a test checks them against the library's


@click.command()
@model_options
@data_option(required=True)
@max_length_option
@attention_options
@click.option("--task", type=click.Choice(TASKS), default=None,
              help="How to score: classification or lm (next token). Default: the checkpoint's task, else guessed.")
@method_option()
@click.option("--methods", default=None, metavar="NAMES",
              help="Find the circuit under the first of these methods (e.g. zero,mean,resample) and say whether it "
                   "still holds under each other one (overrides --method).")
@click.option("--draws", type=int, default=None,
              help="resample: donors per example, whose outcomes are averaged (default 2, at most 1000).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the donors and of the bootstrap intervals (0 to 2**63 - 1).")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="Edges verified exactly by path patching, the ones the estimator ranks first (default: every "
                   "edge of a model with at most 256, else 50).")
@click.option("--faithfulness", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True,
              callback=finite,
              help="Share of the loss gap (every edge removed vs none) the minimal circuit must keep.")
@click.option("--estimator", type=click.Choice(ESTIMATORS), default="eap", show_default=True,
              help="Edge attribution: eap (one forward and backward per batch) or eap-ig (integrated gradients, "
                   "for saturated models whose clean gradient is near 0).")
@click.option("--correction", type=click.Choice(("holm", "bh")), default="holm", show_default=True,
              help="Multiple-testing correction across the edges tested.")
@click.option("--mlps/--no-mlps", default=True, show_default=True,
              help="Each layer's MLP as a node (edges into and out of it) where the model's adapter declares it.")
@min_effect_option()
@batch_size_option
@click.option("--json", "json_path", type=click.Path(path_type=str), default=None,
              help="Write the diagnose.circuit/1 JSON here (atomically).")
@html_option
def circuit(model: str, factory: str | None, forward: str | None, trust_pickle: bool, attn_implementation: str | None,
            data: str, max_length: int | None, attention_module: str | None, n_heads: int | None, task: str | None,
            method: str, methods: str | None, draws: int | None, seed: int, top: int | None, faithfulness: float,
            estimator: str, correction: str, mlps: bool, min_effect: float, batch_size: int | None,
            json_path: str | None, html_path: str | None) -> None:
    """Find the circuit: which heads read which, and which reach the output.

    Every edge (a head to a later head's query, key or value input, or to the output; with
    --mlps, also into and out of each layer's MLP where the adapter declares it) is
    removed alone by path patching, every other path held at its clean value, and tested as
    diagnose heads tests a head: change in loss with its 95 % CI, the corrected p-value, the
    verdict. Then the minimal circuit: the fewest edges keeping --faithfulness of the loss gap,
    with its interval, how often each edge is kept over bootstrap resamples, whether it holds
    under each of --methods, and each edge's self-repair gap (its effect inside the circuit
    minus alone). On a large model an edge attribution (EAP) ranks every edge first and the
    --top ones are patched exactly. Data that names a wrong answer per unit (wrong_labels)
    also gets the logit difference, per edge and the circuit's share of it.

    Under torchrun each process measures a shard of the examples, as diagnose heads does; the
    per-example results are gathered, so the output is one process's, and only rank 0 prints
    and writes (start it with `torchrun ... --no-python diagnose`).

    \b
    Example: diagnose circuit demo-out/induction/model.pt --data demo-out/induction/eval.pt --json circuit.json
             diagnose circuit model.pt --data eval.pt --methods zero,mean --html circuit.html
             torchrun --nproc-per-node 4 --no-python diagnose circuit model.pt --data eval.pt --json circuit.json
    """
    check_outputs({"--json": json_path, "--html": html_path}, inputs=[model, data])  # before the slow imports
    compared = parse_methods(methods) if methods is not None else None
    from diagnose.ablation.methods import check_compared_draws, check_seed

    check_seed(seed, "--seed")  # before the model is loaded, as diagnose heads does
    check_compared_draws(compared or [method], draws, "--draws")
    from diagnose.circuit import find_circuit
    from diagnose.distributed import init_from_env, leave

    from .heads import _load

    ranks, device = init_from_env()  # torchrun: join the group (NCCL on this rank's GPU, else gloo)
    # every rank loads; one failing tells the others, so none is left waiting in a collective
    net, ds, sites, task = ranks.run_local("loading the model and data", lambda: _load(
        model, factory, trust_pickle, attn_implementation, data, max_length, attention_module, n_heads, task, forward))
    if device is not None:
        net.to(device)
    from ._progress import progress_bar

    with progress_bar("finding the circuit", shown=ranks.main) as bar:
        result = find_circuit(net, ds, method=method, methods=compared, top=top, faithfulness=faithfulness,
                              estimator=estimator, task=task, batch_size=batch_size, draws=draws, seed=seed,
                              correction=correction, min_effect=min_effect, sites=sites, mlps=mlps,
                              distributed=ranks.active, progress=bar)
    leave()  # on an error the group stays up until rank 0 has said it (cli.main, say_on_rank0)
    if ranks.main:  # under torchrun, rank 0 prints and writes
        _outputs(result, json_path, html_path)


def _outputs(result, json_path: str | None, html_path: str | None) -> None:
    """The JSON (atomically), the table, and the report."""
    if json_path:
        result.save(json_path)
    _print(result)
    if html_path:
        from diagnose.display import plain

        from ._report import write_report_noting

        click.echo(f"report: {plain(write_report_noting([result], html_path))}")


def _print(result) -> None:
    from rich.console import Console

    from diagnose.display import head_label, text

    from ._table import print_sections

    out = Console(highlight=False, width=max(Console().width, 132))
    b = result.baseline
    mlps = result.model.get("mlps") or []
    out.print(text(f"{result.model['family']} model, {result.model['n_layers']} layers"
                   + (f" (MLP nodes in {len(mlps)})" if mlps else "") + f", {result.n_edges} edges; "
                   f"{result.task}, {result.method} ablation, {result.n_examples} examples; baseline accuracy "
                   f"{b['accuracy']:.2%}, loss {b['loss']:.4f}"
                   + (f", logit diff {b['logit_diff']:.3f} (label - wrong answer)" if "logit_diff" in b else "")))
    print_sections(out, result.sections())
    for name, held in result.circuit.methods.items():
        f = held["faithfulness"]
        ld = held.get("faithfulness_logit_diff")
        out.print(text(f"under {name}: the circuit keeps {'-' if f is None else f'{f:.2f}'} of the loss gap"
                       + ("" if ld is None else f" and {ld:.2f} of the logit difference's")
                       + f" ({'holds' if held['holds'] else 'does not hold'})"))
    a = result.attribution
    if a:
        rho = a["spearman_vs_exact"]
        out.print(text(f"{a['estimator']}: ranked {a['n_edges']} edges, verified the top {a['n_verified']}"
                       + ("" if rho is None else f" (Spearman to exact {rho:+.2f})")))
    for h in result.heads:
        out.print(text(f"{head_label(h['layer'], h['head'])}: {h['role'] or 'no named pattern'}"))
    for note in result.notes:
        out.print(text(f"note: {note}"))
