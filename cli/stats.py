"""`diagnose stats RUN_DIR`: training health from a TrainingMonitor run folder."""

from __future__ import annotations

import os

import click

from diagnose.display import plain

from ._options import check_outputs, factory_option, html_option, trust_pickle_option


def _format_field(x, fmt: str) -> str:
    """One field of a step record as text: numbers in `fmt`, a list (one lr per group) joined by
    commas, "-" for a missing value, anything else as it is."""
    if isinstance(x, list):  # one lr per parameter group
        return ",".join(_format_field(v, fmt) for v in x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "-" if x is None else str(x)
    return format(x, fmt)


def _step_line(rec: dict) -> str:
    line = (f"step {rec.get('step')}  loss {_format_field(rec.get('loss'), '.6g')}  grad norm {_format_field(rec.get('grad_norm'), '.4g')}"
            f"  lr {_format_field(rec.get('lr'), '.4g')}")
    if rec.get("step_time") is not None:
        line += f"  {_format_field(rec['step_time'], '.3g')} s/step"
    if rec.get("tokens_per_s") is not None:
        line += f"  {_format_field(rec['tokens_per_s'], '.4g')} tokens/s"
    return plain(line)


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--follow", "follow_", is_flag=True,
              help="Print steps and alerts live until the run closes or its writer process is gone "
                   "(Ctrl-C stops).")
@click.option("--tensorboard", "tb_dir", type=click.Path(), default=None,
              help="Also export the run's scalars to this TensorBoard log folder.")
@click.option("--step", "step", type=int, default=None, metavar="N",
              help="Show logged step N in full, with the batch saved there by save_spikes (its tensors and the "
                   "examples with the highest loss).")
@click.option("--replay", "replay_step", type=int, default=None, metavar="STEP",
              help="Replay the spike saved at STEP (save_spikes=True) on --model: each block's share of the gradient "
                   "norm, the heads whose logits or entropy jumped, the worst examples, and which cures (skip the "
                   "batch, lr/10, clip, clamped attention logits, Adam eps) would have kept the loss down.")
@click.option("--model", "model", type=click.Path(path_type=str), default=None, metavar="MODEL",
              help="For --replay: a model file of the run's architecture (a diagnose checkpoint, a Hugging Face "
                   "folder, or a state_dict with --factory); its weights are replaced by the saved ones.")
@factory_option
@trust_pickle_option
@click.option("--loss", "loss", metavar="MODULE:FUNCTION", default=None,
              help="For --replay: fn(model, batch) -> per-example loss [B] (default: cross-entropy of an "
                   "(inputs, targets) batch or of a dict with labels).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@click.option("--heads", "heads_", is_flag=True,
              help="Also print each head's importance (|dL/dgate|) and role at the sampled steps.")
@html_option
def stats(run_dir: str, follow_: bool, tb_dir: str | None, step: int | None, replay_step: int | None,
          model: str | None, factory: str | None, trust_pickle: bool, loss: str | None, as_json: bool,
          heads_: bool, html_path: str | None) -> None:
    """Summarise a run folder: loss, grad norms and activations through depth, attention entropy, alerts,
    evaluations, step time and throughput, and the signals the run did not record, with why.
    (The alert kinds and how each was validated: docs/monitor.md; logit_divergence is validated on
    hand-made records only: no small proxy run has shown an output-logit divergence z-loss cures.)

    \b
    Example: diagnose stats runs/exp1 --follow
             diagnose stats runs/exp1 --html run.html
             diagnose stats runs/exp1 --step 120
             diagnose stats runs/exp1 --replay 120 --model model.pt
             diagnose stats runs/exp1 --heads
    """
    check_outputs({"--html": html_path, "--tensorboard": tb_dir}, inputs=[run_dir], folders=["--tensorboard"])
    from rich.console import Console
    from rich.text import Text

    from diagnose.display import plain as clean
    from diagnose.monitor import follow as follow_run
    from diagnose.monitor import read_run
    from diagnose.monitor import alert_line, summarize

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=240)  # piped: rich's default 80 columns would cut names
    if follow_:
        follow_run(run_dir, lambda r: console.print(Text(_step_line(r))), lambda a: console.print(alert_line(a)),
                   on_note=lambda msg: click.echo(clean(msg), err=True))
    run = read_run(run_dir)
    if step is not None or replay_step is not None:  # one step in full, or its spike replayed
        from ._replay import detail_command

        detail_command(run, step, replay_step, model, factory, trust_pickle, loss, as_json, console)
        return
    summary = summarize(run)
    if tb_dir:
        from diagnose.monitor import export_tensorboard

        n = export_tensorboard(run, tb_dir)
        if not as_json:
            console.print(Text(f"wrote {n} scalars to {clean(tb_dir)}"))
    _print_summary(run, summary, console, as_json, heads_)
    if html_path:
        from diagnose.reports import write_report

        path = write_report([run], html_path)
        if not as_json:
            console.print(Text(f"report: {clean(path)}"))


def _print_summary(run, summary: dict, console, as_json: bool, heads_: bool) -> None:
    """The summary as JSON or tables, its heads section, and the signals the run lacks with why (issue 33)."""
    from rich.text import Text

    from diagnose import files as _json  # dumps: the one strict JSON policy
    from diagnose.display import plain as clean
    from diagnose.monitor import heads_summary, lacking_lines, lacking_signals, render_summary

    heads = heads_summary(run)
    if as_json:
        click.echo(_json.dumps({**summary, "lacking_signals": lacking_signals(run), "heads": heads}, indent=1))
        return
    from ._stats_heads import print_heads

    render_summary(summary, console)
    print_heads(heads, console, heads_)
    for line in lacking_lines(run):  # a signal missing says so, with the reason
        console.print(Text(clean(line)))
