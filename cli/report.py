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
    optionally `diagnose check --json` files; the kind of each is detected. The report opens
    offline in any browser and fetches nothing.

    Example: diagnose report heads.json runs/exp1 -o report.html
    """
    import warnings

    from diagnose._terminal import plain
    from diagnose._write import check_outputs
    from diagnose.reports import write_report
    from diagnose.reports.view import ReportNote

    check_outputs({"-o": output}, inputs=sources)
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", ReportNote)
        path = write_report(list(sources), output, title=title)
    for note in notes:
        if issubclass(note.category, ReportNote):
            click.echo(f"note: {plain(note.message)}", err=True)
    click.echo(f"Report written to {path.resolve()}")
