"""Entry point: the `diagnose` group. Each command lives in its own module and is thin:
parse options, call one library function, print. A DiagnoseError becomes one line on
stderr and exit code 2 -- never a traceback.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from functools import partial

import click

from diagnose import __version__
from diagnose.display import plain
from diagnose.errors import DiagnoseError
from diagnose.notes import Note


class _Group(click.Group):
    """Turns the library's errors into one clean line and exit code 2, and Ctrl-C into
    "interrupted" and exit code 130 (click's own answer is "Aborted!" and 1)."""

    def invoke(self, ctx: click.Context):
        notes: list[str] = []
        try:
            with warnings.catch_warnings():
                warnings.showwarning = partial(_show_note, notes)
                try:
                    out = super().invoke(ctx)
                except (click.exceptions.Exit, SystemExit):  # a result with its own exit code (check --strict)
                    _say(notes)
                    raise
            _say(notes)  # after the result, and never before an error: that stays the one line said
            return out
        except click.UsageError:  # a bad option: under torchrun every rank meets it; rank 0 prints click's message
            if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0":
                ctx.exit(2)
            raise
        except DiagnoseError as exc:
            # messages quote file names and values from files: printed as text, no escapes;
            # under torchrun every rank meets the same error (or is told another's): rank 0 says it,
            # and the others wait until it has, since the first to exit gets the rest stopped
            line = f"error: {plain(exc)}"
            if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
                click.echo(line, err=True)
            else:
                from diagnose.distributed import say_on_rank0

                say_on_rank0(lambda: click.echo(line, err=True))
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            if _peer_gone(exc):  # the rank that failed says why; repeating it as a traceback helps no one
                if os.environ.get("RANK", "0") == "0":  # rank 0 was left waiting for a peer that died outright
                    first = _first_sentence(str(exc))
                    click.echo(f"error: another torchrun process exited while this one waited for it in a "
                               f"collective ({type(exc).__name__}: {plain(first)}); its own output says why", err=True)
                ctx.exit(2)
            raise


_show_warning = warnings.showwarning


def _say(notes: list[str]) -> None:
    for line in dict.fromkeys(notes):
        click.echo(f"note: {line}", err=True)


def _show_note(notes: list[str], message, category, filename, lineno, file=None, line=None) -> None:
    """Keep a diagnose.notes.Note for one `note: ...` line on stderr; show any other warning as Python does."""
    if issubclass(category, Note):
        notes.append(plain(message))
    else:
        _show_warning(message, category, filename, lineno, file, line)


_PEER_GONE = ("Connection closed", "Connection reset", "Broken pipe", "recvBytes", "sendBytes", "peer", "NCCL",
              "gloo")


def _first_sentence(text: str) -> str:
    """gloo's "[.../pair.cc:553] Connection closed by peer [127.0.0.1]:48327. This is typically ..." as
    "Connection closed by peer [127.0.0.1]:48327": its first sentence, without the source location."""
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|py):\d+\]\s*", "", (text.strip().splitlines() or [""])[0])
    return re.split(r"(?<=\S)\. ", line, maxsplit=1)[0][:160]


def _peer_gone(exc: Exception) -> bool:
    """Under torchrun: the collective failed because another process exited (on rank 0, one that died outright)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if type(exc).__module__.startswith("torch.distributed"):  # DistNetworkError, DistStoreError, ...
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _PEER_GONE)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="diagnose")
def cli() -> None:
    """See what is really happening inside a PyTorch Transformer.

    \b
    diagnose demo                                   train demo models, write demo-out/
    diagnose heads MODEL --data DATA                which heads matter (ablation + significance)
    diagnose circuit MODEL --data DATA              which heads feed which (path patching + significance)
    diagnose heads-over CKPT... --data DATA         each head across checkpoints, what changed
    diagnose stats RUN_DIR                          training health from a TrainingMonitor run
    diagnose report SOURCES... -o report.html       one self-contained HTML report
    diagnose check MODEL                            wiring bugs: masks, scaling, positions
    diagnose info MODEL [--data DATA]               does my file load, does my data fit it
    diagnose prune MODEL --data DATA --out DIR      remove the heads it can do without
    """


def _register() -> None:
    # Imported here so that `diagnose --help` stays fast and each command stays in its file.
    from . import check, circuit, demo, heads, heads_over, info, prune, report, stats

    cli.add_command(demo.demo)
    cli.add_command(stats.stats)
    cli.add_command(info.info)
    cli.add_command(report.report)
    cli.add_command(heads.heads)
    cli.add_command(circuit.circuit)
    cli.add_command(heads_over.heads_over)
    cli.add_command(check.check)
    cli.add_command(prune.prune)


_register()


def main() -> None:
    try:
        cli.main(prog_name="diagnose", standalone_mode=True)
    except SystemExit as exc:
        if exc.code == 130:
            _exit_interrupted()
        raise
    except KeyboardInterrupt:  # Ctrl-C before or after a command runs
        click.echo("interrupted", err=True)
        _exit_interrupted()


def _exit_interrupted() -> None:
    """Exit with 130 for certain. A Ctrl-C that lands while an extension module runs Python code
    during its import leaves CPython's "unhandled KeyboardInterrupt" flag set even though the
    exception was handled here, and the interpreter then re-kills itself with SIGINT at exit
    (status -2, not 130). Everything diagnose writes is complete or absent (atomic writes),
    so skipping the interpreter's teardown loses nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)
