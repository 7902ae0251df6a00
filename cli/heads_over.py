"""`diagnose heads-over`: the exact heads sweep on several checkpoints of one run, and what changed between them."""

from __future__ import annotations

import click

from ._options import (
    batch_size_option,
    min_effect_option,
    attn_implementation_option,
    check_outputs,
    data_option,
    factory_option,
    forward_option,
    html_option,
    max_length_option,
    method_option,
    trust_pickle_option,
)


@click.command("heads-over")
@click.argument("checkpoints", nargs=-1, required=True, metavar="CHECKPOINT...", type=click.Path(path_type=str))
@factory_option
@forward_option
@trust_pickle_option
@attn_implementation_option
@data_option(required=True)
@max_length_option
@method_option()
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the bootstrap intervals (0 to 2**63 - 1).")
@min_effect_option("each checkpoint's baseline loss")
@batch_size_option
@click.option("--json", "json_path", type=click.Path(path_type=str), default=None,
              help="Write the diagnose.heads-over-checkpoints/1 JSON here (atomically).")
@html_option
def heads_over(checkpoints: tuple[str, ...], factory: str | None, forward: str | None, trust_pickle: bool,
               attn_implementation: str | None, data: str, max_length: int | None, method: str, seed: int,
               min_effect: float, batch_size: int | None, json_path: str | None, html_path: str | None) -> None:
    """Run the exact heads sweep on each checkpoint of one run, with the same data, and say what changed.

    Prints each head's verdict and Δloss (95 % interval) at every checkpoint, then the heads whose verdict
    changed between two consecutive checkpoints, with both intervals: the heads that stopped mattering
    (a fine-tuning regression) and those that became vital. Name the checkpoints in training order.

    \b
    Example: diagnose heads-over ckpt_100.pt ckpt_200.pt ckpt_300.pt --data eval.pt --html heads-over.html
    """
    from diagnose.errors import ConfigError

    if len(checkpoints) < 2:
        raise ConfigError(f"{checkpoints[0]}: name at least two checkpoints of one run, in training order")
    check_outputs({"--json": json_path, "--html": html_path}, inputs=[*checkpoints, data])
    from diagnose.ablation.methods import check_seed

    check_seed(seed, "--seed")  # before the first checkpoint is loaded
    from diagnose.ablation import AblationConfig, ablate_heads, compare_checkpoints

    from ._progress import progress_bar
    from .heads import _load

    results = []
    for path in checkpoints:  # one at a time: only one model is held in memory
        net, ds, sites, task = _load(path, factory, trust_pickle, attn_implementation, data, max_length, None, None,
                                     None, forward)
        config = AblationConfig(task=task, method=method, seed=seed, min_effect=min_effect, batch_size=batch_size,
                                direct=False)
        with progress_bar(f"ablating heads of {path}") as bar:
            results.append(ablate_heads(net, ds, config=config, sites=sites, progress=bar))
        del net
    result = compare_checkpoints(results, list(checkpoints))
    _write(result, json_path, html_path)


def _write(result, json_path: str | None, html_path: str | None) -> None:
    from diagnose.display import plain

    data = result.to_json()
    if json_path:
        result.save(json_path)
    _print(data)
    if html_path:
        from ._report import write_report_noting

        click.echo(f"report: {plain(write_report_noting([result], html_path))}")


def _interval(c: dict) -> str:
    if c["delta_loss"] is None:
        return "not verified"
    ci = c["delta_loss_ci"]
    return f"{c['delta_loss']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")


def _print(data: dict) -> None:
    """The heads x checkpoints table, then what changed in words."""
    from rich.console import Console
    from rich.text import Text

    from diagnose.display import head_label, text
    from diagnose.schema import Field

    from ._table import table

    out = Console(highlight=False, width=max(Console().width, 120))
    m = data["model"]
    out.print(text(f"{m['family']} model, {m['n_layers']} layers x {m['n_heads']} heads; {data['task']}, "
                   f"{data['method']} ablation, {data['n_examples']} examples at each of "
                   f"{len(data['checkpoints'])} checkpoints"))
    names = data["checkpoints"]
    columns = [Field("head", "head", "s")] + [Field(f"c{i}", name, "s") for i, name in enumerate(names)]
    rows = [{"head": head_label(h["layer"], h["head"]),
             **{f"c{i}": f"{c['verdict'] or ''} {_interval(c)}" for i, c in enumerate(h["cells"])}}
            for h in data["heads"]]
    out.print(table(columns, rows))
    for c in data["changes"]:
        out.print(text(f"{head_label(c['layer'], c['head'])} {c['kind']} from {c['from_checkpoint']} to "
                       f"{c['to_checkpoint']}: {c['before']['verdict']}, Δloss {_interval(c['before'])} -> "
                       f"{c['after']['verdict']}, Δloss {_interval(c['after'])}"))
    if not data["changes"]:
        out.print(Text("No head's verdict changed between consecutive checkpoints."))
