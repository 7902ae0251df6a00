"""The edges of a circuit: a sender head to a receiver head's query, key or value input, or to the output.

Elhage et al. 2021 name the three ways a later head reads an earlier one: through its queries
(Q-composition), its keys (K-composition) or its values (V-composition). A head's write also
reaches the output on its direct path. An edge is one such read, every sender in an earlier layer
than its receiver. Under grouped-query attention a key or value input belongs to a key/value head,
which every query head of its group shares, so the receiver of a k or v edge is that key/value head.
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
COMPOSITION = {"q": "Q", "k": "K", "v": "V", OUTPUT: "direct"}


@dataclass(frozen=True)
class Edge:
    """Sender (layer, head) -> receiver (layer, head) through `part` (q, k, v), or -> the output (part 'out',
    receiver None). Under grouped-query attention a k / v receiver head is a key/value head."""

    sender: tuple[int, int]
    receiver: tuple[int, int] | None
    part: str

    @property
    def composition(self) -> str:
        """Q, K or V (Elhage et al. 2021), or 'direct' for a head's path to the output."""
        return COMPOSITION[self.part]

    @property
    def label(self) -> str:
        """'L0.H1 -> L1.H0 (k)', 'L1.H0 -> output'."""
        s = head_label(*self.sender)
        if self.receiver is None:
            return f"{s} -> output"
        return f"{s} -> {head_label(*self.receiver)} ({self.part})"

    def to_json(self) -> dict:
        return {"sender": list(self.sender), "receiver": None if self.receiver is None else list(self.receiver),
                "part": self.part, "composition": self.composition, "label": self.label}


def receiver_heads(site: "AttentionSite", part: str) -> int:
    """How many heads of `site` receive through `part`: its query heads, or its key/value heads for k and v."""
    if part in ("k", "v") and site.n_kv_heads:
        return int(site.n_kv_heads)
    return site.n_heads


def all_edges(sites: Sequence["AttentionSite"]) -> list[Edge]:
    """Every edge of the model, receivers in layer order then q, k, v, the output edges last."""
    edges = []
    for r, site in enumerate(sites):
        for part in PARTS:
            for h in range(receiver_heads(site, part)):
                edges += [Edge((s, hs), (r, h), part) for s in range(r) for hs in range(sites[s].n_heads)]
    edges += [Edge((s, hs), None, OUTPUT) for s, site in enumerate(sites) for hs in range(site.n_heads)]
    return edges


def parse_edge(text: str) -> Edge:
    """'L0.H1->L1.H0(k)' or 'L1.H0->output' (spaces ignored) as an Edge; ConfigError with the form otherwise."""
    import re

    m = re.fullmatch(r"L(\d+)\.H(\d+)->(?:L(\d+)\.H(\d+)\(([qkv])\)|output)", text.replace(" ", ""))
    if not m:
        raise ConfigError(f"{text!r} is not an edge; write it as L0.H1->L1.H0(k) or L1.H0->output")
    sender = (int(m[1]), int(m[2]))
    return Edge(sender, None, OUTPUT) if m[3] is None else Edge(sender, (int(m[3]), int(m[4])), m[5])
