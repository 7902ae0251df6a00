"""`diagnose prune`: remove the heads the model can do without, and write the smaller model."""

from __future__ import annotations

import click

from diagnose.ablation.methods import FOLDABLE as METHODS  # the registry's methods a cut model reproduces; no torch

from ._options import (
    batch_size_option,
    check_outputs,
    data_option,
    html_option,
    max_length_option,
    method_option,
    model_options,
)

TASKS = ("classification", "lm")  # literal so that --help needs no torch


@click.command()
@model_options
@data_option(required=True)
@click.option("--eval", "eval_path", metavar="DATA", type=click.Path(path_type=str), default=None,
              help="Held-out data for the before/after accuracy and loss (not used to choose).")
@max_length_option
@click.option("--max-drop", type=float, default=None,
              help="Accuracy points (of 100) a classifier may lose on --data (default 1.0; refused for a "
                   "language model, whose budget is --max-loss).")
@click.option("--max-loss", type=float, default=None,
              help="Mean loss (nats per scored token) the model may gain on --data (lm default 0.05).")
@click.option("--task", type=click.Choice(TASKS), default=None,
              help="classification or lm; default: the checkpoint's task, else guessed from the labels.")
@method_option(foldable=True, note="A removed head's replacement is folded into the output projection's bias.")
@click.option("--candidates", type=click.IntRange(min=1), default=4, show_default=True,
              help="Heads verified exactly each round (the best by the --fast estimate).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Remove at most this many heads.")
@batch_size_option
@click.option("--out", "out_dir", type=click.Path(path_type=str), default=None,
              help="Write the pruned model here (a new or empty folder, outside the input folders), in the "
                   "form it came in.")
@click.option("--json", "json_path", type=click.Path(path_type=str), default=None,
              help="Write the diagnose.prune/1 JSON here (atomically).")
@html_option
def prune(model: str, factory: str | None, forward: str | None, trust_pickle: bool, attn_implementation: str | None,
          data: str,
          eval_path: str | None, max_length: int | None, max_drop: float | None, max_loss: float | None,
          task: str | None, method: str, candidates: int, limit: int | None, batch_size: int | None,
          out_dir: str | None, json_path: str | None, html_path: str | None) -> None:
    """Remove attention heads one at a time while the model stays within budget, then cut them out.

    Each round ranks the heads left by the --fast estimate, verifies the best --candidates
    exactly (through the head gate, earlier removals in place), removes the one that costs
    least, and re-measures; it stops when one more would cost more than --max-drop accuracy
    points (or --max-loss) on --data. The pruned copy's outputs are checked against the
    gated original's; --eval gives held-out figures; parameters and forward time are
    measured before and after. The input model is never modified.

    \b
    Example: diagnose prune model/ --data dev.jsonl --eval test.jsonl --max-drop 1 --out pruned/ --json prune.json
    """
    for name, value in (("--max-drop", max_drop), ("--max-loss", max_loss)):
        if value is not None and not value >= 0:
            from diagnose.errors import ConfigError

            raise ConfigError(f"{name} {value}: must be 0 or more (how much the model may lose)")
    inputs = [model, data, eval_path]
    # every output, --out included, is checked before any work: a bad path costs nothing
    check_outputs({"--out": out_dir, "--json": json_path, "--html": html_path}, inputs=inputs, folders=("--out",))
    net, ds, held, task = _load(model, factory, trust_pickle, attn_implementation, data, eval_path, max_length,
                                task, out_dir, inputs, forward)
    _check_budget(task, max_drop, max_loss)
    from diagnose.display import head_label
    from diagnose.prune import prune_heads

    def step(s, choice) -> None:
        click.echo(f"removed {head_label(s.layer, s.head)} ({s.n_removed} of {sum(choice.n_heads)}): accuracy "
                   f"{s.accuracy:.2%}, loss {s.loss:.4f}", err=True)

    result = prune_heads(net, ds, max_drop=max_drop, max_loss=max_loss, task=task, method=method, eval_data=held,
                         candidates=candidates, limit=limit, batch_size=batch_size, on_step=step)
    _write(result, out_dir, json_path, html_path)


def _load(model, factory, trust_pickle, attn_implementation, data, eval_path, max_length, task, out_dir, inputs,
          forward=None):
    """The model, the data, the held-out data and the task, each tried once before any round."""
    from pathlib import Path

    from diagnose.io import load_data_for, load_model, trial_forward
    from diagnose.objectives import default_task
    from diagnose.prune.save import check_folder

    if out_dir:
        check_folder(Path(out_dir), inputs=inputs)
    net = load_model(model, factory=factory, trust_pickle=trust_pickle, attn_implementation=attn_implementation,
                     forward=forward)
    ds = load_data_for(net, data, max_length=max_length)
    trial_forward(net, ds)
    held = load_data_for(net, eval_path, max_length=max_length) if eval_path else None
    if held is not None:
        trial_forward(net, held)  # token ids and labels of the held-out file too, before any round
    task = task or default_task(net, ds)
    _check_labels(task, ((data, ds), (eval_path, held)))
    return net, ds, held, task


def _write(result, out_dir: str | None, json_path: str | None, html_path: str | None) -> None:
    """The pruned model, the JSON and the report; a failed model save is raised after the figures are written."""
    from diagnose.display import plain
    from diagnose.errors import OutputError

    failed = None
    if out_dir:
        try:
            result.save_pretrained(out_dir)
        except OutputError as exc:  # the model is kept in $TMPDIR (named); the figures still get written
            failed = exc
    if json_path:
        result.save(json_path)
    _print(result.to_json(), json_path)
    if html_path:
        from ._report import write_report_noting

        click.echo(f"report: {plain(write_report_noting([result.to_json()], html_path))}")
    if failed is not None:
        raise failed


def _check_budget(task: str, max_drop: float | None, max_loss: float | None) -> None:
    """--max-drop is an accuracy budget for a classifier: on a language model say so, never ignore it."""
    from diagnose.errors import ConfigError

    if task == "lm" and max_drop is not None:
        raise ConfigError(f"--max-drop {max_drop:g}: accuracy points are a classification budget, and this is a "
                          "language model (task lm); give its budget as --max-loss (nats per token), or pass "
                          "--task classification")


def _check_labels(task: str, files: tuple) -> None:
    """Each (path, data) pair has the labels `task` scores against (None data: not given)."""
    from diagnose.errors import DataError
    from diagnose.io import check_task

    for path, d in files:
        if d is not None and task == "classification" and getattr(d, "labels", None) is None:
            raise DataError(f"{path}: has no labels; pruning a classifier measures accuracy against them: add "
                            "labels (a `label` field in text data), or pass --task lm")
        if d is not None:
            check_task(d, task)


def _print(d: dict, json_path: str | None) -> None:
    from diagnose.display import text

    b, size = d["baseline"], d["size"]
    click.echo(text(f"{d['model']['family']} model: removed {d['n_removed']} of {d['n_heads_total']} heads "
                    f"({d['fraction_removed']:.0%}); heads left per layer {d['heads_left']}"))
    after = d["data"]["after"]
    click.echo(f"on --data ({d['n_examples']} examples, used to choose): accuracy {b['accuracy']:.2%} -> "
               f"{after['accuracy']:.2%}, loss {b['loss']:.4f} -> {after['loss']:.4f}")
    if d["eval"]:
        e = d["eval"]
        click.echo(f"on --eval ({e['n_examples']} held-out examples): accuracy {e['before']['accuracy']:.2%} -> "
                   f"{e['after']['accuracy']:.2%} ({e['delta_accuracy']:+.2%}, sampling noise ±{e['noise']:.2%}), "
                   f"loss {e['before']['loss']:.4f} -> {e['after']['loss']:.4f}")
    speed = f"{size['speedup']:.2f}x" if size["speedup"] else "n/a"
    click.echo(f"parameters {size['parameters_before']:,} -> {size['parameters_after']:,}; forward "
               f"{size['forward_seconds_before'] * 1e3:.1f} ms -> {size['forward_seconds_after'] * 1e3:.1f} ms "
               f"({speed}, batch {size['batch']}, {size['threads']} threads)")
    v = d["verify"]
    click.echo(f"pruned outputs equal the gated model's: max |diff| {v['max_abs_diff']:.2g} (tolerance "
               f"{v['tolerance']:.2g}); stopped: {d['stop']['reason']}")
    for note in d["notes"]:
        click.echo(f"note: {note}")
    if d["saved"]:
        click.echo(text(f"pruned model: {d['saved']['path']} ({d['saved']['form']})"))
    if json_path:
        click.echo(text(f"JSON: {json_path}"))
