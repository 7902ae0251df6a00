"""`diagnose info`: does my model file load, and does my data fit it?"""

from __future__ import annotations

from typing import Any

import click

from ._options import data_option, max_length_option, model_options


@click.command()
@model_options
@data_option()
@max_length_option
def info(model: str, factory: str | None, forward: str | None, trust_pickle: bool, attn_implementation: str | None,
         data: str | None, max_length: int | None) -> None:
    """Load MODEL (and --data) the way every command does, and say what is in them.

    \b
    Example: diagnose info demo-out/order/model.pt --data demo-out/order/eval.pt
    """
    from diagnose.io import (
        describe_data,
        describe_model,
        load_data_for,
        load_model,
        trial_forward,
    )

    net = load_model(model, factory=factory, trust_pickle=trust_pickle, attn_implementation=attn_implementation,
                     forward=forward)
    m = describe_model(net)
    _echo(f"model       {m['source']}  ({m['format']})")
    _echo(f"class       {m['class']}")
    _echo(f"parameters  {m['parameters']:,}" + ("" if m["trainable"] == m["parameters"]
                                                else f" ({m['trainable']:,} trainable)"))
    if m["config"]:
        _echo(f"config      {_pairs(m['config'])}")
    _echo(f"tokenizer   {m['tokenizer'] or 'none'}")
    if data is None:
        return
    ds = load_data_for(net, data, max_length=max_length)
    fit = trial_forward(net, ds)
    d = describe_data(ds)
    _echo(f"data        {d['source']}")
    if "image_size" in d:  # pixel_values
        c, h, w = d["image_size"]
        lo, hi = d["pixel_range"]
        _echo(f"examples    N={d['n_examples']}  images {c}x{h}x{w}  pixel values {lo:.3g}..{hi:.3g}")
    else:
        _echo(f"examples    N={d['n_examples']}  T={d['seq_len']}  token ids {d['token_ids'][0]}..{d['token_ids'][1]}")
        _echo("padding     " + (f"{d['padding_share']:.1%} of positions" if d["has_attention_mask"]
                                else "no attention_mask"))
    lab = d["labels"]
    if lab is None and "image_size" in d:
        _echo("labels      none (images are scored against class labels [N]: heads and prune need them)")
    elif lab is None:
        _echo("labels      none (language-model data: targets are the inputs shifted by one)")
    else:
        extra = f", {lab['scored_share']:.1%} of positions scored" if lab["kind"] == "token" else ""
        _echo(f"labels      {lab['kind']} {lab['shape']}, {lab['min']}..{lab['max']} "
              f"({lab['distinct']} distinct{extra})")
    fits = "" if fit["labels_fit"] is None else "; labels fit"
    last = " (last position only: scored on the token after each example's last input)" \
        if fit["last_position_only"] else ""
    _echo(f"output      {fit['output_shape']} on the first {min(2, d['n_examples'])} examples{fits}{last}")


def _echo(line: str) -> None:
    """Model configs and file names are data: printed as text without control characters."""
    from diagnose.display import plain

    click.echo(plain(line))


def _pairs(cfg: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())
