"""Head pruning: from "which heads matter" to a smaller, faster model (Michel et al. 2019).

Public: `prune_heads` and its `PruneResult` (`.model`, `.save_pretrained(dir)` for the model,
`.save(path)` and `.to_json()` for the figures), and the `diagnose.prune/1` SCHEMA.

Modules, in the order one `prune_heads` call uses them:
- api: `prune_heads`: checks the options, runs the steps below, assembles the result.
- _measure: prune's view of the one ablation sweep: the removed heads are its closed base, each
  round its ranked way (the estimate from its accumulator, the candidates ablated exactly).
- choose: the greedy loop: estimate, verify the best candidates exactly, remove one, repeat.
- cut: a copy of the model with the chosen heads sliced out by _slice, the one slicer, from the
  projection layout each family's adapter declares (diagnose/adapters/layout.py).
- verify: pruned against gated outputs, held-out accuracy and loss, parameters, forward time.
- result: the dataclasses and their JSON.
- save: writes the pruned model in the form it came in; _folder reads a pruned Hugging Face folder
  back (a folder kind registered with io, which never imports prune); _spec checks that folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

from . import _folder  # noqa: F401  registers the pruned-folder kind with io; costs no torch

# Imported on first use (PEP 562): `import diagnose` registers the folder kind above without torch.
_HOMES = {"prune_heads": ".api", "SCHEMA": ".result", "PruneResult": ".result"}

if TYPE_CHECKING:
    from .api import prune_heads
    from .result import SCHEMA, PruneResult


__getattr__, __dir__ = lazy_names(__name__, _HOMES)


__all__ = ["SCHEMA", "PruneResult", "prune_heads"]
