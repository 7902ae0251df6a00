"""The circuit section: an SVG graph of the edges that matter (layers left to right, heads as nodes, each
layer's MLP node, where the document has them, a square in the row below, after its layer's heads; the
output last; edge width the effect, q / k / v / MLP input / direct told apart by colour and dash, the
interval in each edge's hover title) and the edge table, from a `diagnose.circuit/1` JSON document. Every field read is
checked here first, so that drawing cannot fail half-way; the template escapes everything it prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.display import head_label
from diagnose.errors import InputFileError
from diagnose.files import kind, number
from diagnose.schema import Section

CIRCUIT_SCHEMA = "diagnose.circuit/1"
_FIX = "regenerate it with `diagnose circuit --json`"
MAX_HEADS = 1 << 16
MAX_DRAWN = 60  # edges drawn: the circuit's, then the others that matter, largest first
X0, GAP, Y0, ROW, R = 50, 150, 30, 34, 11
PART_OFFSET = {"q": -6, "k": 0, "v": 6, "out": 0, "mlp": 0}  # where on the receiver a q / k / v edge lands


@dataclass
class Node:
    x: float
    y: float
    label: str
    in_circuit: bool
    kind: str = "head"  # or "mlp"


@dataclass
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    width: float
    part: str
    title: str
    in_circuit: bool


@dataclass
class CircuitSection:
    name: str
    data: dict[str, Any]
    width: int
    height: int
    nodes: list[Node]
    lines: list[Line]
    output: tuple[float, float]
    summary: list[tuple[str, str]]
    sections: list[Section] = field(default_factory=list)
    anchor: str = "circuit-1"  # the article's id, which the heads section links to
    heads: list[tuple[str, str, str]] = field(default_factory=list)  # the circuit's heads: (label, role, row id)


def _index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _pair(value: Any, where: str, name: str) -> list[int]:
    """A (layer, head) pair, or (layer, null): the layer's MLP node."""
    if not (isinstance(value, list) and len(value) == 2 and _index(value[0])
            and (value[1] is None or _index(value[1]))):
        raise InputFileError(f"{where}: `{name}` is {kind(value)}, not a (layer, head) pair; {_FIX}")
    return value


def _label(node: tuple) -> str:
    return f"MLP{node[0]}" if node[1] is None else head_label(*node)


def _edge(e: Any, where: str, heads: list[int], mlps: list[int]) -> dict[str, Any]:
    if not isinstance(e, dict) or e.get("part") not in PART_OFFSET:
        raise InputFileError(f"{where}: an edge is not an object with a part q, k, v, mlp or out; {_FIX}")
    for name in ("sender", "receiver"):
        if name == "receiver" and e.get("receiver") is None:
            continue
        layer, head = _pair(e.get(name), where, name)
        if layer >= len(heads) or (head is None and layer not in mlps) or (head is not None and head >= heads[layer]):
            raise InputFileError(f"{where}: `{name}` {_label((layer, head))} is not a node of the model; {_FIX}")
    for name in ("delta_loss", "delta_logit_diff"):
        if e.get(name) is not None and number(e[name]) is None:
            raise InputFileError(f"{where}: `{name}` is {kind(e[name])}, not a number; {_FIX}")
        if e.get(f"{name}_ci") is not None and not _two_numbers(e[f"{name}_ci"]):
            raise InputFileError(f"{where}: `{name}_ci` is not two numbers; {_FIX}")
    return e


MAX_METHODS = 10  # methods the circuit is checked under, each a row of the summary (the heads view names 10 too)


def check_circuit(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The document, its fields the section reads checked (InputFileError naming the field otherwise)."""
    model, circuit = data.get("model"), data.get("circuit")
    heads = model.get("heads") if isinstance(model, dict) else None
    if not (isinstance(heads, list) and heads and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                      for h in heads)) or sum(heads) > MAX_HEADS:
        raise InputFileError(f"{where}: `model.heads` is not a list of head counts per layer; {_FIX}")
    mlps = model.get("mlps", [])  # absent in documents written before MLP nodes: none
    if not (isinstance(mlps, list) and all(_index(m) and m < len(heads) for m in mlps)):
        raise InputFileError(f"{where}: `model.mlps` is not a list of the layers whose MLP is a node; {_FIX}")
    if not isinstance(data.get("edges"), list) or not isinstance(circuit, dict) \
            or not isinstance(circuit.get("edges"), list):
        raise InputFileError(f"{where}: a {CIRCUIT_SCHEMA} document needs `edges` and `circuit.edges` lists; {_FIX}")
    for e in data["edges"] + circuit["edges"]:
        _edge(e, where, heads, mlps)
    for key, want, what in (("heads", list, "a list"), ("sections", list, "a list")):
        if data.get(key) is not None and not isinstance(data[key], want):
            raise InputFileError(f"{where}: `{key}` is {kind(data[key])}, not {what}; {_FIX}")
    methods = circuit.get("methods")
    if methods is not None and not (isinstance(methods, dict) and len(methods) <= MAX_METHODS):
        raise InputFileError(f"{where}: `circuit.methods` is not an object of at most {MAX_METHODS} methods; {_FIX}")
    for h in data.get("heads") or []:
        if not (isinstance(h, dict) and isinstance(h.get("layer"), int) and isinstance(h.get("head"), int)
                and (h.get("role") is None or isinstance(h["role"], str))):
            raise InputFileError(f"{where}: a circuit head is not an object with a layer, a head and a role; {_FIX}")
    for name in ("faithfulness", "faithfulness_logit_diff", "target"):
        if circuit.get(name) is not None and number(circuit[name]) is None:
            raise InputFileError(f"{where}: `circuit.{name}` is {kind(circuit[name])}, not a number; {_FIX}")
    return data


def _title(e: dict[str, Any]) -> str:
    ci = e.get("delta_loss_ci")
    d = number(e.get("delta_loss"))
    interval = "" if ci is None else f", 95 % CI [{number(ci[0]):+.4f}, {number(ci[1]):+.4f}]"
    ld, ld_ci = number(e.get("delta_logit_diff")), e.get("delta_logit_diff_ci")
    diff = "" if ld is None else f"; Δlogit diff {ld:+.3f}" + (
        "" if ld_ci is None else f", 95 % CI [{number(ld_ci[0]):+.3f}, {number(ld_ci[1]):+.3f}]")
    return (f"{e.get('label', '')}: Δloss {'-' if d is None else f'{d:+.4f}'} nats{interval}{diff}; "
            f"{e.get('verdict') or 'no verdict'}{'; in the circuit' if e.get('in_circuit') else ''}")


def _two_numbers(ci: Any) -> bool:
    return isinstance(ci, list) and len(ci) == 2 and all(number(x) is not None for x in ci)


def _share(f: float | None, ci: Any) -> str:
    return "-" if f is None else f"{f:.2f}" + ("" if not _two_numbers(ci) else
                                               f" (95 % CI {number(ci[0]):.2f} to {number(ci[1]):.2f})")


def circuit_section(name: str, data: dict[str, Any], sections: list[Section], index: int = 1) -> CircuitSection:
    """The graph's nodes and lines, the summary rows and the circuit's heads, for one checked document (the
    index-th circuit of the report: its anchor)."""
    heads = data["model"]["heads"]
    kept = {tuple(map(tuple, (e["sender"], e["receiver"] or [-1, -1]))) + (e["part"],) for e in data["circuit"]["edges"]}
    drawn = [e for e in data["edges"] if e.get("in_circuit") or e.get("verdict") == "matters"]
    drawn = sorted(drawn, key=lambda e: (not e.get("in_circuit"), -abs(number(e.get("delta_loss")) or 0.0)))[:MAX_DRAWN]
    big = max([abs(number(e.get("delta_loss")) or 0.0) for e in drawn] + [1e-12])
    mlps = data["model"].get("mlps", [])
    at = {(l, h): (X0 + l * GAP, Y0 + h * ROW) for l, n in enumerate(heads) for h in range(n)}
    at.update({(l, None): (X0 + l * GAP + GAP / 2, Y0 + max(heads) * ROW) for l in mlps})  # after the layer's heads
    out = (X0 + len(heads) * GAP, Y0 + (max(heads) - 1) * ROW / 2)
    used = {tuple(e["sender"]) for e in drawn} | {tuple(e["receiver"]) for e in drawn if e["receiver"]}
    in_circuit = {tuple(e["sender"]) for e in data["circuit"]["edges"]} | \
                 {tuple(e["receiver"]) for e in data["circuit"]["edges"] if e["receiver"]}
    nodes = [Node(x, y, _label(n), n in in_circuit, "head" if n[1] is not None else "mlp") for n, (x, y) in at.items()
             if n in used or len(at) <= 64]
    lines = []
    for e in drawn:
        x1, y1 = at[tuple(e["sender"])]
        x2, y2 = out if e["receiver"] is None else at[tuple(e["receiver"])]
        key = (tuple(e["sender"]), tuple(e["receiver"] or [-1, -1]), e["part"])
        lines.append(Line(x1 + R, y1, x2 - R, y2 + PART_OFFSET[e["part"]],
                          1 + 7 * abs(number(e.get("delta_loss")) or 0.0) / big, e["part"], _title(e), key in kept))
    c = data["circuit"]
    summary = [("edges in the model", str(data.get("n_edges", "-"))), ("edges verified", str(len(data["edges"]))),
               ("minimal circuit", f"{len(c['edges'])} edges"),
               ("faithfulness", _share(number(c.get("faithfulness")), c.get("faithfulness_ci")))]
    if number(c.get("faithfulness_logit_diff")) is not None:
        summary.append(("faithfulness, logit diff",
                        _share(number(c["faithfulness_logit_diff"]), c.get("faithfulness_logit_diff_ci"))))
    summary.append(("target", "-" if number(c.get("target")) is None else f"{number(c['target']):.0%}"))
    for method, held in (c.get("methods") or {}).items():
        hf = number(held.get("faithfulness")) if isinstance(held, dict) else None
        summary.append((f"under {method}", ("-" if hf is None else f"{hf:.2f}") +
                        (" (holds)" if isinstance(held, dict) and held.get("holds") else " (does not hold)")))
    width = int(out[0] + 60)
    height = int(Y0 + (max(heads) + bool(mlps)) * ROW + 10)
    anchor = f"circuit-{index}"
    roles = {(h["layer"], h["head"]): h.get("role") or "" for h in data.get("heads") or []}
    named = [(head_label(l, h), roles.get((l, h), ""), f"{anchor}-head-{l}-{h}")
             for l, h in sorted(n for n in in_circuit if n[1] is not None)]
    return CircuitSection(name, data, width, height, nodes, lines, out, summary, sections, anchor, named)


def links_for(name: str, family: str, n_layers: int, n_heads: int,
              circuits: list[CircuitSection]) -> tuple[CircuitSection | None, dict[str, str]]:
    """The circuit of the model a heads source measured (the same family and layers x heads; of several, the
    one whose name shares the heads source's folder, else the first) and its heads' row ids by label."""
    same = [c for c in circuits if c.data["model"].get("family") == family
            and c.data["model"]["heads"] == [n_heads] * n_layers]
    folder = name.rsplit("/", 1)[0] if "/" in name else None
    found = next((c for c in same if folder is not None and c.name.rsplit("/", 1)[0] == folder), None)
    found = found or (same[0] if same else None)
    return found, ({} if found is None else {label: row for label, _, row in found.heads})
