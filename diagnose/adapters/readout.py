"""Where a family's residual stream meets the output: the final norm that the direct effects read.

A head's direct effect (ablation/direct.py) is its output removed on the direct path to the output
only: the final norm's input is the clean residual stream minus the head's projected output, every
other component frozen at its clean value. That needs a pre-norm residual stream (each attention
write added to the stream unchanged, nothing but the final norm between the last block and the
output layers). An adapter declares it with a method `final_norm(model)` that returns the norm
module, or raises ConfigError with one line saying why its model has no such path (post-norm BERT:
every later layer's LayerNorm sits on the path).
"""

from __future__ import annotations

import torch.nn as nn

from ..errors import ConfigError


def final_norm(adapter, model: nn.Module) -> nn.Module:
    """The adapter's declared final norm; ConfigError (one line) when it declares none or has no path."""
    declared = getattr(adapter, "final_norm", None)
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the hooks go on the module it wraps
    if declared is None:
        raise ConfigError(f"the {adapter.family} adapter declares no final norm of a pre-norm residual stream "
                          "(diagnose/adapters/readout.py), so direct effects are not measured")
    return declared(model)


def named(model: nn.Module, suffix: str, what: str) -> nn.Module:
    """The one module whose qualified name is `suffix` or ends with '.' + suffix; ConfigError otherwise."""
    found = [m for n, m in model.named_modules() if n == suffix or n.endswith("." + suffix)]
    if len(found) != 1:
        raise ConfigError(f"{what}: found {len(found)} modules named {suffix!r} where one final norm was expected, "
                          "so direct effects are not measured")
    return found[0]
