"""View model of one `diagnose.heads/1` or `/2` document: layer x head grids, significance, flags,
rank correlations between what a heatmap shows and what ablation proves, packed example maps.

It renders what the document says and recomputes no statistic: significance is each head's
`significant`, the correlations are the document's `correlations`, the flags its `flags` list.
An older document without one of these shows less (nothing marked, no correlation table).
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnose.display import head_label, heads_label
from diagnose.ablation.verdict import DETECTABLE, MATTERS, VERDICTS
from diagnose.errors import InputFileError
from diagnose.head_fields import ATTENTION, HEAD_NUMBERS
from diagnose.statistics import ATTENTION_STATS, Statistic, role_label, shown

from ._sources import _is_pair

MAX_EXAMPLES = 4
MAX_TOKENS = 128
MIN_TOKENS = 8  # the fewest tokens of an example shown, however many heads share the budget
# Raw bytes of quantised attention kept per heads document (base64 adds a third): keeps a
# 12x12-head report with several 64-token examples well under the 15 MB page budget.
MAP_BYTE_BUDGET = 4_500_000


@dataclass
class Flag:
    layer: int
    head: int
    kind: str
    reason: str
    group: list[tuple[int, int]] = field(default_factory=list)  # a flag on several heads (redundant_group)
    depends_on_method: bool = False  # --methods: a flagged head's verdict differs between methods

    @property
    def label(self) -> str:
        return heads_label(self.group) or head_label(self.layer, self.head)


@dataclass
class Group:
    """Heads closed at once (`diagnose heads --together`), next to the sum of their single effects."""

    label: str
    accuracy: float
    delta_accuracy: float
    delta_loss: float
    sum_single_accuracy: float  # what closing them would cost if their effects simply added up
    sum_single_loss: float


@dataclass
class Correlation:
    statistic: str
    effect: str
    rho: float
    p_value: float
    n: int


@dataclass
class HeadRow:
    """One head's numbers for the page: `values` holds every per-head number (head_fields.HEAD_NUMBERS)
    and every attention statistic by name, None where missing (a dash on the page, not "nan")."""

    head: int
    label: str  # "L0.H3"
    role: str
    significant: bool
    values: dict[str, float | None]
    verdict: str = ""  # "matters", "detectable but negligible", "negligible", "undecided"; "" unknown


@dataclass
class LayerRows:
    """One layer's heads for the page."""

    layer: int
    n_significant: int
    flagged: list[str]  # "L0.H3", ... of the flags on this layer
    top_head: int | None  # the head whose removal raises the loss most
    top_delta_loss: float
    rows: list[HeadRow]
    n_matters: int = 0


@dataclass
class HeadsView:
    name: str
    family: str
    n_layers: int
    n_heads: int
    task: str
    method: str
    n_examples: int | None
    baseline: dict[str, Any]
    seconds: float | None
    grids: dict[str, np.ndarray]  # each [n_layers, n_heads], NaN where missing
    significant: np.ndarray  # [n_layers, n_heads] bool
    ranked: list[dict[str, Any]]  # heads sorted by causal effect, largest harm first
    flags: list[Flag]
    correlations: list[Correlation]
    examples: list[dict[str, Any]] = field(default_factory=list)  # packed for the page
    example_texts: list[list[str]] = field(default_factory=list)  # tokens of each kept example
    examples_note: str = ""
    together: list[Group] = field(default_factory=list)
    shared: str = ""  # layers applied at several depths (ALBERT), said in words; "" when none
    roles: np.ndarray | None = None  # [n_layers, n_heads] role names ("" unknown), from the heads JSON
    verdicts: np.ndarray | None = None  # [n_layers, n_heads] each head's verdict ("" unknown)
    depends: list[str] = field(default_factory=list)  # --methods: "L0.H1 (zero: matters, mean: negligible)"
    undecided: list[str] = field(default_factory=list)  # --methods: heads firm under one method, undecided under another
    compared: list[str] = field(default_factory=list)  # --methods: the methods compared
    n_depends: int = 0  # how many heads `depends` stands for (it names MAX_LISTED, then counts the rest)
    n_undecided: int = 0  # likewise for `undecided`
    direct: dict[str, Any] | None = None  # how direct effects were measured, or why not (None: a /1 document)
    compensated: list[dict[str, Any]] = field(default_factory=list)  # heads whose direct effect the rest restores

    def statistics(self, place: str) -> list[Statistic]:
        """The attention statistics shown at `place` ("table": the page's head tables; "effect_grid")."""
        return shown(place)

    @property
    def n_significant(self) -> int:
        return int(self.significant.sum())

    @property
    def matters(self) -> np.ndarray:
        """[n_layers, n_heads] the heads whose verdict is "matters" (significant and outside the band): the
        ones the plots mark, so no picture calls a detectable but negligible head significant."""
        return self.significant.copy() if self.verdicts is None else self.verdicts == MATTERS

    def n_verdict(self, name: str) -> int:
        """How many heads have the verdict `name` (verdict.VERDICTS)."""
        return 0 if self.verdicts is None else int((self.verdicts == name).sum())

    @property
    def n_total(self) -> int:
        return self.n_layers * self.n_heads

    def layers(self) -> list[LayerRows]:
        """Every head's numbers, layer by layer (for the page when the grids are too big to print them)."""
        flagged: dict[int, list[str]] = {}
        for f in self.flags:
            flagged.setdefault(f.layer, []).append(head_label(f.layer, f.head))
        g = self.grids
        out = []
        for layer in range(self.n_layers):
            rows = [HeadRow(head, head_label(layer, head),
                            "" if self.roles is None else role_label(str(self.roles[layer, head])),
                            bool(self.significant[layer, head]), {k: _known(g[k][layer, head]) for k in g},
                            "" if self.verdicts is None else str(self.verdicts[layer, head]))
                    for head in range(self.n_heads)]
            loss = g["delta_loss"][layer]
            top = int(np.nanargmax(loss)) if np.isfinite(loss).any() else None
            out.append(LayerRows(layer, int(self.significant[layer].sum()), flagged.get(layer, []),
                                 top, float(loss[top]) if top is not None else math.nan, rows,
                                 sum(r.verdict == MATTERS for r in rows)))
        return out


def _plot_float(value: Any) -> float:
    """A float; beyond +-1e300 (where matplotlib's axis arithmetic overflows) it is taken as infinite."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    except OverflowError:  # an integer of 400 digits: as large as an infinity (as the `num` filter shows it)
        return math.inf if value > 0 else -math.inf
    return math.copysign(math.inf, out) if abs(out) > 1e300 else out


def _repair_key(head: dict[str, Any]) -> float:
    """The largest self-repair first; a missing or non-finite one last."""
    value = _plot_float(head.get("self_repair"))
    return -value if math.isfinite(value) else math.inf


def _known(value: float) -> float | None:
    """None for a missing number (NaN in the grids), so the page prints a dash, not "nan"."""
    return None if math.isnan(value) else float(value)


def _harm_key(head: dict[str, Any]) -> tuple[float, float]:
    """Sort key putting the heads whose removal raises the loss most first (the ablation
    engine's own ranking), accuracy drop breaking ties; missing numbers go last."""
    def finite(v: float) -> float:
        return v if math.isfinite(v) else math.inf

    return finite(-_plot_float(head.get("delta_loss"))), finite(_plot_float(head.get("delta_accuracy")))


def _flags(raw: Any) -> list[Flag]:
    """The document's flags: a list of {kind, layer, head, reason, heads?} (contrast.py writes them)."""
    out = []
    for f in raw if isinstance(raw, list) else []:
        if not isinstance(f, dict) or not isinstance(f.get("layer"), int) or not isinstance(f.get("head"), int):
            continue
        group = [(int(m[0]), int(m[1])) for m in f.get("heads") or []
                 if isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, int) for x in m)]
        out.append(Flag(f["layer"], f["head"], str(f.get("kind") or "flagged"), str(f.get("reason") or ""), group,
                        f.get("depends_on_method") is True))
    return out


def _correlations(raw: Any) -> list[Correlation]:
    """The document's own rank correlations, {"effect": name, stat: {rho, p_value, n}}, for every
    attention statistic and grad_importance, in that order."""
    if not isinstance(raw, dict) or not isinstance(raw.get("effect"), str):
        return []
    out = []
    for stat in (*ATTENTION_STATS, "grad_importance"):
        c = raw.get(stat)
        if isinstance(c, dict) and all(isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool)
                                       for k in ("rho", "p_value")):
            n = c.get("n")  # a count: a whole number a page can print, else 0 (as a missing one)
            n = n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2 ** 63 else 0
            # a 400-digit rho from a dict source is as large as an infinity, never an OverflowError
            out.append(Correlation(stat, raw["effect"], _plot_float(c["rho"]), _plot_float(c["p_value"]), n))
    return out


def _pack_examples(raw: Any, n_layers: int, n_heads: int, where: str,
                   budget: int) -> tuple[list[dict[str, Any]], list[str], str]:
    """Kept examples' maps quantised to one byte per cell (sqrt scale, so small weights keep
    resolution), base64 per head, within `budget` bytes; returns (packed, texts, note)."""
    if not raw:
        return [], [], ""
    if not isinstance(raw, list):
        raise InputFileError(f"{where}: `examples` must be a list of {{tokens, attention}} objects")
    packed, texts, notes, used = [], [], [], 0
    for i, ex in enumerate(raw[:MAX_EXAMPLES]):
        tokens = ex.get("tokens") if isinstance(ex, dict) else None
        try:
            att = np.asarray(ex.get("attention"), dtype=np.float32)  # [L, H, Tq, Tk]
        except (TypeError, ValueError, AttributeError, OverflowError):  # a 400-digit number: no map either
            att = np.zeros(0)
        if not isinstance(tokens, list) or att.ndim != 4 or att.shape[:2] != (n_layers, n_heads) \
                or att.shape[3] != len(tokens) or att.shape[2] > att.shape[3]:
            raise InputFileError(f"{where}: examples[{i}] needs `tokens` [T] and `attention` "
                                 f"[{n_layers}][{n_heads}][Tq][T]; got {list(att.shape)} for "
                                 f"{len(tokens) if isinstance(tokens, list) else '?'} tokens")
        tq, tk = att.shape[2:]
        keep = min(tk, MAX_TOKENS)
        cost = n_layers * n_heads * min(tq, keep) * keep
        if packed and used + cost > budget:
            notes.append(f"{len(raw) - i} more example(s) left out to keep the page small")
            break
        if cost > budget:  # a big model: the first example alone is over budget, so fewer of its tokens
            keep = max(MIN_TOKENS, min(keep, math.isqrt(budget // (n_layers * n_heads))))
            cost = n_layers * n_heads * min(tq, keep) * keep
        q0 = tk - tq  # queries are the last Tq positions when Tq < Tk
        att = att[:, :, : max(0, keep - q0), :keep]  # [L, H, tq', keep]
        if keep < tk:
            notes.append(f"example {i + 1}: first {keep} of {tk} tokens shown")
        q = np.rint(np.sqrt(np.clip(np.nan_to_num(att), 0.0, 1.0)) * 255).astype(np.uint8)
        maps = [[base64.b64encode(q[layer, h].tobytes()).decode("ascii") for h in range(n_heads)]
                for layer in range(n_layers)]
        toks = [str(t) for t in tokens[:keep]]
        packed.append({"tokens": toks, "q_offset": q0, "n_q": int(att.shape[2]), "n_k": keep, "maps": maps})
        texts.append(toks)  # shown token by token, each in its own bidi isolate
        used += cost
    if len(raw) > MAX_EXAMPLES:
        notes.append(f"{len(raw) - MAX_EXAMPLES} more example(s) in the file are not shown")
    return packed, texts, "; ".join(notes)


def _groups(raw: Any, heads: list[dict[str, Any]]) -> list[Group]:
    by_head = {(h.get("layer"), h.get("head")): h for h in heads}
    out = []
    for g in raw if isinstance(raw, list) else []:
        members = [tuple(m) for m in g.get("heads") or [] if isinstance(m, (list, tuple)) and len(m) == 2] \
            if isinstance(g, dict) else []
        if not members:
            continue
        singles = [by_head.get(m, {}) for m in members]
        out.append(Group(heads_label(members), _plot_float(g.get("accuracy")),
                         _plot_float(g.get("delta_accuracy")), _plot_float(g.get("delta_loss")),
                         sum(_plot_float(h.get("delta_accuracy")) for h in singles),
                         sum(_plot_float(h.get("delta_loss")) for h in singles)))
    return out


def shared_note(model: dict[str, Any]) -> str:
    """One sentence per module the model applies at several depths, naming the layers it became."""
    notes = []
    shared = model.get("shared")
    for g in (shared if isinstance(shared, list) else [])[:MAX_LISTED]:  # a list of objects, a few of them
        if isinstance(g, dict) and isinstance(g.get("layers"), list):
            more = ", ..." if len(g["layers"]) > MAX_LISTED else ""
            layers = ", ".join(f"L{i}" for i in g["layers"][:MAX_LISTED]) + more
            notes.append(f"{str(g.get('module'))[:80]} is one set of weights applied {g.get('applications')!s:.20} "
                         f"times per forward; each application is its own layer here ({layers}), with its own map, "
                         "statistics and ablation (closing a head closes it at that depth only).")
    return " ".join(notes)


def heads_view(name: str, data: dict[str, Any], budget: int = MAP_BYTE_BUDGET) -> HeadsView:
    """Build the view of one heads document (already checked by sources.load_sources)."""
    model = data["model"]
    n_layers, n_heads = model["n_layers"], model["n_heads"]
    grids = {k: np.full((n_layers, n_heads), np.nan) for k in (*HEAD_NUMBERS, *ATTENTION_STATS)}
    significant = np.zeros((n_layers, n_heads), dtype=bool)
    roles = np.full((n_layers, n_heads), "", dtype=object)
    verdicts = np.full((n_layers, n_heads), "", dtype=object)
    for h in data["heads"]:
        at = (h["layer"], h["head"])
        roles[at] = h.get("role") if isinstance(h.get("role"), str) else ""
        for k in HEAD_NUMBERS:
            grids[k][at] = _plot_float(h.get(k))
        for k in ATTENTION_STATS:
            grids[k][at] = _plot_float((h.get(ATTENTION) or {}).get(k))
        significant[at] = h.get("significant") is True
        verdicts[at] = _verdict(h)
    ranked = sorted(data["heads"], key=_harm_key)
    examples, texts, note = _pack_examples(data.get("examples"), n_layers, n_heads, name, budget)
    timing = data.get("timing") or {}
    agreement = data.get("agreement")
    return HeadsView(
        name=name, family=str(model.get("family", "unknown")), n_layers=n_layers, n_heads=n_heads,
        shared=shared_note(model),
        task=str(data.get("task", "")), method=str(data.get("method", "")),
        n_examples=data.get("n_examples") if isinstance(data.get("n_examples"), int) else None,
        baseline=data.get("baseline") or {}, seconds=_plot_float(timing.get("seconds")) if timing else None,
        grids=grids, significant=significant, ranked=ranked, flags=_flags(data.get("flags")),
        correlations=_correlations(data.get("correlations")), examples=examples, example_texts=texts,
        examples_note=note, together=_groups(data.get("together"), data["heads"]),
        roles=roles if roles.astype(bool).any() else None, verdicts=verdicts,
        depends=_depends(agreement, True), undecided=_depends(agreement, False), compared=_compared(agreement),
        n_depends=len(_listed(agreement, True)), n_undecided=len(_listed(agreement, False)),
        direct=data.get("direct") if isinstance(data.get("direct"), dict) else None,
        compensated=sorted((h for h in data["heads"] if h.get("compensated") is True),
                           key=_repair_key))


def _verdict(h: dict[str, Any]) -> str:
    """The head's verdict as the document says it; an older document without one: significant and
    negligible is "detectable but negligible", significant alone "matters" ("" when unverified)."""
    if h.get("verdict") in VERDICTS:
        return h["verdict"]
    if h.get("verified") is False or "verdict" in h:
        return ""
    if h.get("significant") is True:
        return DETECTABLE if h.get("negligible") is True else MATTERS
    return "negligible" if h.get("negligible") is True else "undecided" if h.get("significant") is False else ""


def _compared(agreement: Any) -> list[str]:
    methods = agreement.get("methods") if isinstance(agreement, dict) else None
    return [str(m)[:40] for m in methods[:10]] if isinstance(methods, list) else []  # a few names, not a file's worth


def _depends(agreement: Any, contradicting: bool) -> list[str]:
    """_listed's heads as a page names them: the first MAX_LISTED, then one line counting the rest (the JSON
    keeps every one)."""
    out = _listed(agreement, contradicting)
    if len(out) > MAX_LISTED:
        out = out[:MAX_LISTED] + [f"{len(out) - MAX_LISTED} more heads (agreement in the JSON)"]
    return out


def _listed(agreement: Any, contradicting: bool) -> list[str]:
    """"L0.H1 (zero: matters, mean: negligible)" for each head whose verdict depends on the method:
    contradicting, those that matter under one method and are negligible under another (all of them in a
    document without `contradicts`); else the others, firm under one method and undecided under another."""
    methods = _compared(agreement)
    rows = agreement.get("heads") if isinstance(agreement, dict) else None
    listed = agreement.get("contradicts") if isinstance(agreement, dict) else None
    strong = ({tuple(m) for m in listed if _is_pair(m)} if isinstance(listed, list) else None)
    out = []
    for r in rows if isinstance(rows, list) else []:
        if not (isinstance(r, dict) and r.get("agree") is False and isinstance(r.get("verdicts"), dict)
                and isinstance(r.get("layer"), int) and isinstance(r.get("head"), int)):
            continue
        if (strong is None or (r["layer"], r["head"]) in strong) != contradicting:
            continue
        said = ", ".join(f"{m}: {r['verdicts'].get(m)}" for m in methods if isinstance(r["verdicts"].get(m), str))
        out.append(f"{head_label(r['layer'], r['head'])} ({said})")
    return out


MAX_LISTED = 40  # heads named in one sentence of the page
