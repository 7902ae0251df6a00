"""Running under torchrun, for a front end: join the process group its environment names, leave it,
and let rank 0 alone say a failure while the other ranks wait for it (_distributed.py).

Public: `init_from_env() -> (ranks, device)`, `leave()`, `say_on_rank0(say)`. Imports torch.
"""

from __future__ import annotations

from ._distributed import init_from_env, leave, say_on_rank0

__all__ = ["init_from_env", "leave", "say_on_rank0"]
