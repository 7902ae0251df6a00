"""Options shared by the commands that read a model and data (info, heads, check)."""

from __future__ import annotations

import math
from typing import Callable

import click

from diagnose.files import check_outputs  # noqa: F401  (one guard for every command)

model_argument = click.argument("model", metavar="MODEL", type=click.Path(path_type=str))

factory_option = click.option(
    "--factory", metavar="MODULE:FUNCTION", default=None,
    help="A function that builds the model; MODEL is then its state_dict (.pt or .safetensors).")

forward_option = click.option(
    "--forward", metavar="MODULE:FUNCTION", default=None,
    help="A function fn(model, inputs) -> output that calls the model, for a forward whose signature does not "
         "say how (diagnose.calling); inputs are {'input_ids': ..., 'attention_mask': ...} or {'pixel_values': ...}.")

trust_pickle_option = click.option(
    "--trust-pickle", is_flag=True, default=False,
    help="Allow a fully pickled nn.Module. Unpickling runs code from the file: only for files you trust.")

attn_implementation_option = click.option(
    "--attn-implementation", metavar="NAME", default=None,
    help="Hugging Face attention implementation (eager, sdpa); default: the model's own choice.")

max_length_option = click.option(
    "--max-length", type=click.IntRange(min=1), default=None,
    help="Truncate text data to this many tokens, or cut a raw .bin token stream into examples of this many "
         "(default: the model's maximum positions, e.g. max_position_embeddings or block_size).")


batch_size_option = click.option("--batch-size", type=click.IntRange(min=1, max=2 ** 31 - 1), default=None,
                                 help="Examples per batch (default 32).")


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback: NaN and infinities refused in one line before anything loads (a FloatRange lets NaN
    through: it compares false with every bound)."""
    from diagnose.errors import ConfigError

    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{param.opts[0]} must be a finite number, got {value}")
    return value


def min_effect_option(of: str = "the baseline loss") -> Callable:
    """--min-effect: the negligible band of the verdicts, a fraction of `of`."""
    return click.option("--min-effect", type=click.FloatRange(min=0), default=0.05, show_default=True, callback=finite,
                        help=f"Negligible band, as a fraction of {of}: a head is called inert only when the 95 % "
                             "CI of its delta loss lies inside it (and that of its delta accuracy within 2 points).")


def data_option(required: bool = False) -> Callable:
    """--data DATA: .pt/.safetensors/.npz tensors or .jsonl/.csv text."""
    return click.option("--data", "data", metavar="DATA", type=click.Path(path_type=str), required=required,
                        help="Data file: .pt, .safetensors or .npz with input_ids [N, T] (attention_mask, "
                             "labels optional) or pixel_values [N, C, H, W] (labels [N]), a raw uint16 .bin of "
                             "token ids (nanoGPT's), or .jsonl/.csv with text and label.")


def model_options(fn: Callable) -> Callable:
    """MODEL argument plus --factory, --forward, --trust-pickle and --attn-implementation."""
    for deco in (attn_implementation_option, trust_pickle_option, forward_option, factory_option, model_argument):
        fn = deco(fn)
    return fn


def attention_options(fn: Callable) -> Callable:
    """--attention-module NAME and --heads N: name attention layers diagnose cannot recognise."""
    fn = click.option("--heads", "n_heads", type=click.IntRange(min=1), default=None, metavar="N",
                      help="Number of heads of the modules named by --attention-module.")(fn)
    return click.option("--attention-module", "attention_module", metavar="NAME", default=None,
                        help="The attention layers, for models diagnose cannot recognise: their class "
                             "(e.g. 'Attention'), a glob over qualified module names (e.g. "
                             "'encoder.layers.*.attn') or 're:REGEX'. A named module that computes no "
                             "softmax (a feed-forward) is refused.")(fn)


def html_option(f):
    """--html FILE: also write the self-contained HTML report of this command's result."""
    return click.option("--html", "html_path", type=click.Path(path_type=str), default=None,
                        help="Also write a self-contained HTML report here (as `diagnose report` would).")(f)


class _Registered(click.Choice):
    """A click.Choice over a live view of the ablation method registry: read when used, so a method
    registered after this module was imported is offered too."""

    def __init__(self, names):
        self._names = names
        super().__init__(list(names))

    @property
    def choices(self):
        return tuple(self._names)

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ assigns; the registry stays the source
        pass


class _MethodOption(click.Option):
    """--method, whose help is written from the registry when shown (a later entry's line included)."""

    def __init__(self, *args, names=(), note: str = "", **kwargs):
        self._names, self._note = names, note
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str:
        from diagnose.ablation.methods import method_help

        return f"{method_help(self._names)} {self._note}".strip()

    @help.setter
    def help(self, _value) -> None:  # click.Option.__init__ assigns; the registry stays the source
        pass


def method_option(foldable: bool = False, note: str = "") -> Callable:
    """--method NAME, its choices and help read from the ablation method registry
    (diagnose/ablation/methods.py); foldable: only the methods a pruned model can reproduce. note: a
    sentence added to the help."""
    from diagnose.ablation.methods import FOLDABLE, METHODS

    names = FOLDABLE if foldable else METHODS
    return click.option("--method", cls=_MethodOption, names=names, note=note, type=_Registered(names),
                        default="zero", show_default=True)
