"""Where a head's write meets the output: the norms on its path, which the direct effects read.

A head's direct effect (ablation/direct.py) is its output removed on the direct path to the output
only, every other component frozen at its clean value. Its change to the residual stream passes
through the norms on that path, each with its scale frozen at its clean input's (linear in the change),
and moves the output of one module, after which only the output layers run. An adapter declares it:

- `final_norm(model)`: a pre-norm residual stream (each attention write added to the stream unchanged,
  nothing but the final norm between the last block and the output layers). The path is that one
  norm, and the change is added to the norm's output.
- `residual_path(model, site)`: any other path, e.g. post-norm BERT, where the write passes its own
  layer's LayerNorms and both of every later layer's before the encoder's output moves.

Either raises ConfigError with one line saying why its model has no such path; the path is then traced
from one forward (_stream.py). Each norm on it is frozen by the form the adapter declares (norms.py).

Circuits (diagnose/circuit) also read `mlp(model, site)`: the module of the MLP in the site's layer, whose
first input is what the MLP reads (the stream after that layer's attention wrote to it, through the
MLP's own norm) and whose one output tensor is what it adds to the stream. Without it (or where it raises
ConfigError, one line) the circuit's nodes are the heads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError


@dataclass(frozen=True)
class ResidualPath:
    """A head's path to the output: the norms its change crosses, in order, then the module it moves."""
    norms: tuple[nn.Module, ...]  # each one's scale frozen at its clean input
    output: nn.Module  # its output (a tensor, a tuple's first, or last_hidden_state) moves by the change


def residual_path(adapter, model: nn.Module, site) -> ResidualPath:
    """The adapter's declared path from `site` to the output; ConfigError (one line) when it has none."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the hooks go on the module it wraps
    declared = getattr(adapter, "residual_path", None)
    if declared is not None:
        return declared(model, site)
    norm = final_norm(adapter, model)
    return ResidualPath((norm,), norm)


def final_norm(adapter, model: nn.Module) -> nn.Module:
    """The adapter's declared final norm; ConfigError (one line) when it declares none or has no path."""
    declared = getattr(adapter, "final_norm", None)
    model = getattr(model, "_orig_mod", model)
    if declared is None:
        raise ConfigError(f"the {adapter.family} adapter declares no path from a head to the output "
                          "(diagnose/adapters/readout.py), so direct effects are not measured")
    return declared(model)


def moved(output: Any, change: torch.Tensor) -> Any:
    """`output` with its hidden state (a tensor, a tuple's first, a ModelOutput's last_hidden_state) + change."""
    if isinstance(output, torch.Tensor):
        return output + change.to(output.device, output.dtype)
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (output[0] + change.to(output[0].device, output[0].dtype),) + output[1:]
    if isinstance(output, Mapping) and isinstance(output.get("last_hidden_state"), torch.Tensor):
        hidden = output["last_hidden_state"]
        output["last_hidden_state"] = hidden + change.to(hidden.device, hidden.dtype)  # ModelOutput: item and attribute
        return output
    raise ConfigError(f"the path's output is a {type(output).__name__}, with no hidden state to move, so direct "
                      "effects are not measured")


def hidden_of(output: Any) -> torch.Tensor | None:
    """The hidden state `moved` would move, or None."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, Mapping) and isinstance(output.get("last_hidden_state"), torch.Tensor):
        return output["last_hidden_state"]
    return None


def named(model: nn.Module, suffix: str, what: str) -> nn.Module:
    """The one module whose qualified name is `suffix` or ends with '.' + suffix; ConfigError otherwise."""
    found = [m for n, m in model.named_modules() if n == suffix or n.endswith("." + suffix)]
    if len(found) != 1:
        raise ConfigError(f"{what}: found {len(found)} modules named {suffix!r} where one final norm was expected, "
                          "so direct effects are not measured")
    return found[0]


def mlp_of(adapter, model: nn.Module, site) -> nn.Module:
    """The adapter's declared MLP of the site's layer; ConfigError (one line) when it declares none."""
    declared = getattr(adapter, "mlp", None)
    if declared is None:
        raise ConfigError(f"the {adapter.family} adapter declares no MLP per layer (`mlp`, "
                          "diagnose/adapters/readout.py)")
    return declared(getattr(model, "_orig_mod", model), site)


def in_layer(model: nn.Module, site, attribute: str, what: str) -> nn.Module:
    """The module `attribute` of the layer holding `site` (the module the site's attention module sits in,
    by name: 'h.0.attn' -> h.0's `attribute`); ConfigError (one line) when the layer has none."""
    layer = site.name.split("#")[0].rpartition(".")[0]
    parent = model.get_submodule(layer) if layer else model
    found = getattr(parent, attribute, None)
    if not isinstance(found, nn.Module):
        raise ConfigError(f"{what}: the layer {layer or 'model'} of {site.name} has no module `{attribute}` "
                          f"(a {type(parent).__name__})")
    return found
