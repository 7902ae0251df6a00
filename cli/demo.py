"""`diagnose demo`."""

from __future__ import annotations

import click


@click.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(),
              help="Folder to write the demo models, data, runs and report into.")
@click.option("--quick", is_flag=True, help="Train the lesson pairs far fewer steps (a smoke test: their numbers "
              "mean little; the three main models are shipped trained).")
@click.option("--no-lessons", is_flag=True, help="Skip the lesson pairs (only the three main models).")
def demo(out_dir: str, quick: bool, no_lessons: bool) -> None:
    """Analyse small models trained on synthetic tasks, train the lessons, write one report.

    Loads the reference Transformer trained on three synthetic tasks with known mechanisms
    (induction, order, padding; shipped with diagnose and hash-checked, so every machine
    ablates the same weights), ablates every head and checks the wiring; trains the lesson
    pairs that differ in one switch (warmup, Pre/Post-LN, 1/sqrt(d_k), positions, residuals,
    mask fill value); and writes DIR/report.html.

    Example: diagnose demo --out demo-out
    """
    from diagnose.files import check_outputs
    from diagnose.demo import run_demo

    check_outputs({"--out": out_dir}, folders=["--out"])

    result = run_demo(out_dir, quick=quick, lessons=not no_lessons, log=click.echo)
    click.echo(f"\nDemo files are in {result.out_dir.resolve()} ({result.seconds:.0f} s)")
    first = result.models[0]
    if result.report is not None:
        click.echo(f"Report: {result.report.resolve()}")
    click.echo(f"Try:    diagnose heads {first.checkpoint} --data {first.data} --task lm")
    click.echo(f"        diagnose circuit {first.checkpoint} --data {first.data} --methods zero,mean")
    click.echo(f"        diagnose stats {first.run_dir}")
    click.echo(f"        diagnose check {first.checkpoint}")
