"""`diagnose demo`."""

from __future__ import annotations

import click

from diagnose.demo import run_demo


@click.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder to write the demo models, data and reports into.")
def demo(out_dir: str) -> None:
    """Train small models on synthetic tasks and save them with their evaluation data.

    Example: diagnose demo --out demo-out
    """
    result = run_demo(out_dir, log=click.echo)
    click.echo(f"\nDemo files are in {result.out_dir.resolve()}")
    first = result.models[0]
    click.echo(f"Try: diagnose heads {first.checkpoint} --data {first.data}")
