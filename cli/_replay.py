"""`diagnose stats RUN --step N` (one logged step in full) and `--replay STEP --model MODEL` (the saved
spike replayed on the user's model): thin, load the model as every command does, call diagnose.monitor's
step_view or replay, print its tables or its JSON."""

from __future__ import annotations

import click


def detail_command(run, step: int | None, replay_step: int | None, model: str | None, factory: str | None,
                   trust_pickle: bool, loss: str | None, as_json: bool, console) -> None:
    """--replay when given, else --step."""
    from diagnose import files as _json
    from diagnose.monitor import render_step, step_view

    if replay_step is not None:
        replay_command(run, replay_step, model, factory, trust_pickle, loss, as_json, console)
    elif as_json:
        click.echo(_json.dumps(step_view(run, step), indent=1))
    else:
        render_step(step_view(run, step), console)


def replay_command(run, step: int, model: str | None, factory: str | None, trust_pickle: bool,
                   loss: str | None, as_json: bool, console) -> None:
    from diagnose import files as _json
    from diagnose.errors import UsageError
    from diagnose.io import load_model, resolve_factory
    from diagnose.monitor import render_replay, replay

    if model is None:
        raise UsageError(f"--replay {step} needs --model MODEL: a model file of the run's architecture (its "
                         "weights are replaced by the ones saved with the spike), e.g. a diagnose checkpoint, a "
                         "Hugging Face folder, or a state_dict with --factory module:function")
    net = load_model(model, factory=factory, trust_pickle=trust_pickle)
    loss_fn = resolve_factory(loss, option="--loss") if loss else None
    result = replay(run, step, net, loss_fn=loss_fn).to_dict()
    if as_json:
        click.echo(_json.dumps(result, indent=1))
    else:
        render_replay(result, console)
