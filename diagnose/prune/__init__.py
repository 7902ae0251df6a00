"""Head pruning: from "which heads matter" to a smaller, faster model (Michel et al. 2019).

Public: `prune_heads` and its `PruneResult` (`.model`, `.save(dir)`, `.to_json()`), and the
`diagnose.prune/1` SCHEMA.

Modules, in the order one `prune_heads` call uses them:
- api: `prune_heads`: checks the options, runs the steps below, assembles the result.
- _measure: prune's view of the one ablation sweep: the removed heads are its closed base, each
  round its ranked way (the estimate from its accumulator, the candidates ablated exactly).
- choose: the greedy loop: estimate, verify the best candidates exactly, remove one, repeat.
- cut: a copy of the model with the chosen heads sliced out; one _cut_* file per family.
- verify: pruned against gated outputs, held-out accuracy and loss, parameters, forward time.
- result: the dataclass and its JSON.
- save: writes the pruned model in the form it came in.
"""

from .api import prune_heads
from .result import SCHEMA, PruneResult

__all__ = ["SCHEMA", "PruneResult", "prune_heads"]
