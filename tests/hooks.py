"""hook_snapshot: what the tests compare before and after a call to prove no hook is left behind."""

from __future__ import annotations

import torch
import torch.nn as nn

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def hook_snapshot(model: nn.Module) -> dict[str, object]:
    """Every hook a forward could run: per module hook ids, global module hooks, torch function
    modes and the MHA fast-path flag. Equal snapshots before and after = nothing left behind."""
    from torch.nn.modules import module as _mod

    snap: dict[str, object] = {}
    for name, m in model.named_modules():
        for attr in _HOOK_DICTS:
            d = getattr(m, attr, None)
            if d:
                snap[f"{name}.{attr}"] = sorted(d)
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks"):
        snap[attr] = sorted(getattr(_mod, attr, {}))
    snap["torch_function_modes"] = torch._C._len_torch_function_stack()
    snap["mha_fastpath"] = torch.backends.mha.get_fastpath_enabled()
    return snap
