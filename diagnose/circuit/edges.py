"""The edges of a circuit: a sender node to a receiver head's query, key or value input, to an MLP's input,
or to the output.

Elhage et al. 2021 name the three ways a later head reads an earlier one: through its queries
(Q-composition), its keys (K-composition) or its values (V-composition). A head's write also
reaches the output on its direct path. An edge is one such read, every sender in an earlier layer
than its receiver. Under grouped-query attention a key or value input belongs to a key/value head,
which every query head of its group shares, so the receiver of a k or v edge is that key/value head.

Where the adapter declares a layer's MLP (wiring.py), the MLP is a node too: it reads the heads of its
own layer and every earlier node (receiver part 'mlp'), and its write is read by every later head's q,
k and v, every later MLP and the output. A node is (layer, head) for a head and (layer, None) for the
MLP of that layer (written 'MLP1'; in the JSON [1, null], with `sender_kind` / `receiver_kind`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .._head_label import head_label
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..adapters.base import AttentionSite

PARTS = ("q", "k", "v")
OUTPUT = "out"  # the receiver of a head's direct path to the output
MLP = "mlp"  # the receiver part of an edge into an MLP's input
COMPOSITION = {"q": "Q", "k": "K", "v": "V", OUTPUT: "direct", MLP: "MLP"}
Node = tuple  # (layer, head) of a head, (layer, None) of the layer's MLP


def node_label(node: Node) -> str:
    """'L0.H1' for a head, 'MLP1' for layer 1's MLP."""
    return f"MLP{node[0]}" if node[1] is None else head_label(*node)


def node_kind(node: Node | None) -> str:
    """'head', 'mlp', or 'output' (None: the output)."""
    return "output" if node is None else "mlp" if node[1] is None else "head"


@dataclass(frozen=True)
class Edge:
    """Sender node -> receiver head (layer, head) through `part` (q, k, v), -> the MLP (layer, None) of a
    layer (part 'mlp'), or -> the output (part 'out', receiver None). A sender is a head (layer, head) or an
    MLP (layer, None). Under grouped-query attention a k / v receiver head is a key/value head."""

    sender: tuple[int, int | None]
    receiver: tuple[int, int | None] | None
    part: str

    @property
    def composition(self) -> str:
        """Q, K or V (Elhage et al. 2021), 'direct' for a path to the output, 'MLP' for an MLP's input."""
        return COMPOSITION[self.part]

    @property
    def heads_only(self) -> bool:
        """Both ends are heads (the edges Elhage et al. name Q-, K- and V-composition)."""
        return self.sender[1] is not None and self.receiver is not None and self.receiver[1] is not None

    @property
    def label(self) -> str:
        """'L0.H1 -> L1.H0 (k)', 'L1.H0 -> output', 'L1.H0 -> MLP1', 'MLP0 -> L1.H0 (q)'."""
        s = node_label(self.sender)
        if self.receiver is None:
            return f"{s} -> output"
        if self.part == MLP:
            return f"{s} -> {node_label(self.receiver)}"
        return f"{s} -> {head_label(*self.receiver)} ({self.part})"

    def to_json(self) -> dict:
        return {"sender": list(self.sender), "receiver": None if self.receiver is None else list(self.receiver),
                "part": self.part, "composition": self.composition, "label": self.label,
                "sender_kind": node_kind(self.sender), "receiver_kind": node_kind(self.receiver)}


def receiver_heads(site: "AttentionSite", part: str) -> int:
    """How many heads of `site` receive through `part`: its query heads, or its key/value heads for k and v."""
    if part in ("k", "v") and site.n_kv_heads:
        return int(site.n_kv_heads)
    return site.n_heads


def senders(sites: Sequence["AttentionSite"], mlps: Sequence[int] = ()) -> list[Node]:
    """Every sender node in forward order: each layer's heads, then its MLP where `mlps` holds the layer."""
    have = set(mlps)
    return [n for layer, site in enumerate(sites)
            for n in [(layer, h) for h in range(site.n_heads)] + ([(layer, None)] if layer in have else [])]


def all_edges(sites: Sequence["AttentionSite"], mlps: Sequence[int] = ()) -> list[Edge]:
    """Every edge of the model, receivers in layer order (a layer's q, k, v, then its MLP), the output edges
    last; `mlps`: the layers whose MLP is a node (none: heads-only edges)."""
    nodes, have = senders(sites, mlps), set(mlps)
    edges = []
    for r, site in enumerate(sites):
        before = [n for n in nodes if n[0] < r]
        for part in PARTS:
            for h in range(receiver_heads(site, part)):
                edges += [Edge(n, (r, h), part) for n in before]
        if r in have:
            edges += [Edge(n, (r, None), MLP) for n in nodes if n[0] < r or (n[0] == r and n[1] is not None)]
    edges += [Edge(n, None, OUTPUT) for n in nodes]
    return edges


def parse_edge(text: str) -> Edge:
    """'L0.H1->L1.H0(k)', 'L1.H0->output', 'L1.H0->MLP1' or 'MLP0->L1.H0(q)' (spaces ignored) as an Edge;
    ConfigError with the form otherwise."""
    import re

    node = r"(?:L(\d+)\.H(\d+)|MLP(\d+))"
    m = re.fullmatch(rf"{node}->(?:L(\d+)\.H(\d+)\(([qkv])\)|{node}|output)", text.replace(" ", ""))
    if not m or (m[7] is not None):
        raise ConfigError(f"{text!r} is not an edge; write it as L0.H1->L1.H0(k), L1.H0->output, L1.H0->MLP1 or "
                          "MLP0->L1.H0(q)")
    sender = (int(m[3]), None) if m[3] is not None else (int(m[1]), int(m[2]))
    if m[4] is not None:
        return Edge(sender, (int(m[4]), int(m[5])), m[6])
    return Edge(sender, (int(m[9]), None), MLP) if m[9] is not None else Edge(sender, None, OUTPUT)
