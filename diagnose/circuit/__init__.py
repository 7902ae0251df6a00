"""Circuits: which heads feed which, through their queries, keys or values, through MLPs, or the output directly.

Public: `find_circuit` (api.py) and its result `CircuitResult` (result.py, schema `diagnose.circuit/1`),
the `Edge` (edges.py) and `EdgeEffect` (evidence.py). Modules, in the order one call uses them:
- edges: the edges of a model (sender node -> receiver head's q, k or v, an MLP's input, or the output).
- wiring: where each edge starts and ends, from the adapters' declarations.
- mlp: the MLP nodes (where the adapter declares each layer's MLP) and the gate on their writes.
- patch: path patching through the head gate (one edge, or every edge but a circuit's, removed).
- attribution: EAP and EAP-IG, every edge's delta loss from gradients.
- evidence: each patched edge's tests and verdict, the heads' own.
- minimal: the minimal circuit, its faithfulness interval, stability and self-repair gaps.
- result: the typed result, its JSON and DataFrame.
"""

from .._lazy import lazy_names

_EXPORTS = {"find_circuit": ".api", "CircuitResult": ".result", "SCHEMA": ".result", "Edge": ".edges",
            "EdgeEffect": ".evidence", "Circuit": ".minimal"}

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)

__all__ = ["SCHEMA", "Circuit", "CircuitResult", "Edge", "EdgeEffect", "find_circuit"]
