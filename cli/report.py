"""`diagnose report`."""

from __future__ import annotations

import click


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "output", default="report.html", show_default=True, type=click.Path(),
              help="HTML file to write (replaced only once the whole report is built).")
@click.option("--title", default=None, help="Title shown at the top of the report.")
def report(sources: tuple[str, ...], output: str, title: str | None) -> None:
    """Write one self-contained HTML report from heads JSON files and run folders.

    SOURCES are `diagnose heads --json` files, run folders written by TrainingMonitor, and
    optionally `diagnose check --json` files; the kind of each is detected. Several run folders
    are overlaid on shared axes (one colour per run). The report opens offline in any browser
    and fetches nothing.

    Example: diagnose report heads.json runs/exp1 -o report.html
    Example: diagnose report runs/a runs/b -o compare.html
    """
    from diagnose.files import check_outputs

    from ._report import write_report_noting

    check_outputs({"-o": output}, inputs=sources)
    path = write_report_noting(list(sources), output, title=title)
    click.echo(f"Report written to {path.resolve()}")
