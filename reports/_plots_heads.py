"""Head-importance pictures: causal grids beside attention-statistic grids, and the scatter of
what a heatmap shows against what removing the head does."""

from __future__ import annotations

import textwrap

import matplotlib
import numpy as np
import seaborn as sns
from matplotlib.patches import Patch
from matplotlib.patches import Rectangle

from diagnose.statistics import BROAD, BROAD_ROLE, STATISTICS, roles, shown

from ._figures import new_figure, style, to_data_uri
from .view_heads import HeadsView

# Past this many heads a grid is drawn as an image (`_image_grid`) rather than as seaborn's
# cell-by-cell heatmap, whose SVG holds a path per cell: 32 x 32 heads took 16 s and 4 GB for the
# four grids (this 2-core box), and 80 x 64 ran out of memory. The page lists every layer's values.
IMAGE_FROM = 256
MAX_LABELLED = 12  # flagged heads named on scatter plots and squared on image grids (the table lists all)
FLAG_COLOR = {"striking_but_inert": "#1565c0", "diffuse_but_vital": "#c62828"}
EFFECTS = {  # the causal grids' titles; the attention statistics' come from the registry (statistics.py)
    "delta_accuracy": "Δ accuracy when removed",
    "delta_loss": "Δ loss when removed",
    "grad_importance": "gradient importance",
}


def title(key: str) -> str:
    """A grid's title: an effect's, or "attention: " and a statistic's label, wrapped to fit a panel."""
    if key in EFFECTS:
        return EFFECTS[key]
    label = STATISTICS[key].label if key in STATISTICS else key
    return textwrap.fill(f"attention: {label}", 22)


def drawn(v: HeadsView, place: str) -> list[str]:
    """The attention statistics the registry shows at `place` ("effect_grid", "grid", "scatter") that
    hold a finite value somewhere in this document, in registry order."""
    return [s.name for s in shown(place) if s.name in v.grids and np.isfinite(v.grids[s.name]).any()]


def _colours(data: np.ndarray, key: str, diverging: bool) -> dict:
    """cmap and limits of one grid: diverging grids centred on zero (red = removal hurts)."""
    finite = data[np.isfinite(data)]
    if diverging:
        lim = float(np.max(np.abs(finite))) if len(finite) else 1.0
        return {"cmap": "RdBu_r" if key == "delta_loss" else "RdBu", "vmin": -lim or -1, "vmax": lim or 1}
    return {"cmap": "viridis"}


def _ticks(ax, n_layers: int, n_heads: int) -> None:
    """About ten labelled ticks per axis on image grids, at round steps."""
    for n, set_ticks in ((n_heads, ax.set_xticks), (n_layers, ax.set_yticks)):
        step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 1000) if n / s <= 12)
        set_ticks(range(0, n, step))


def _image_grid(ax, v: HeadsView, key: str, diverging: bool) -> None:
    """A big grid as one image: one pixel-row per layer, one pixel per head, scaled up unsmoothed by
    the browser; heads that matter as dots, flagged heads as squares in their flag's colour."""
    data = v.grids[key]  # [n_layers, n_heads]
    kw = _colours(data, key, diverging)
    cmap = matplotlib.colormaps[kw.pop("cmap")].with_extremes(bad="#e0e0e0")  # grey: no value
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, interpolation="none", aspect="auto", **kw)
    ax.figure.colorbar(im, ax=ax, shrink=0.8)
    if key in ("delta_accuracy", "delta_loss"):
        layers, heads = np.nonzero(v.matters)
        ax.scatter(heads, layers, marker=".", s=6, c="black", linewidths=0, zorder=3,
                   rasterized=len(heads) > 200)  # thousands of dots: one raster, not a path each
    marked = v.flags[:MAX_LABELLED]  # flags come ranked; hundreds of squares would hide the grid
    for kind in dict.fromkeys(f.kind for f in marked):
        at = np.array([(f.head, f.layer) for f in marked if f.kind == kind], dtype=float)
        ax.scatter(at[:, 0], at[:, 1], marker="s", s=16, facecolors="none", linewidths=1.0,
                   edgecolors=FLAG_COLOR.get(kind, "#6a1b9a"), zorder=4)
    _ticks(ax, v.n_layers, v.n_heads)
    ax.set_title(title(key))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(labelsize=7)


def _grid(ax, v: HeadsView, key: str, diverging: bool) -> None:
    if is_image(v):
        return _image_grid(ax, v, key, diverging)
    data = v.grids[key]  # [n_layers, n_heads]
    kw = _colours(data, key, diverging)
    if diverging:
        kw["center"] = 0.0
    small = v.n_total <= 64
    sns.heatmap(data, ax=ax, square=v.n_heads <= 3 * v.n_layers, annot=small, fmt=".2f",
                annot_kws={"fontsize": 6}, linewidths=0.4, linecolor="white",
                cbar_kws={"shrink": 0.8}, mask=~np.isfinite(data), **kw)
    if key in ("delta_accuracy", "delta_loss"):
        for layer, head in zip(*np.nonzero(v.matters)):
            # beside the printed value on small grids, in the cell's centre on big ones
            x, y = (head + 0.82, layer + 0.24) if small else (head + 0.5, layer + 0.5)
            ax.scatter([x], [y], marker="*", s=45 if small else 40, c="black", edgecolors="white",
                       linewidths=0.6, zorder=3)
    for f in v.flags:
        ax.add_patch(Rectangle((f.head, f.layer), 1, 1, fill=False, lw=1.8,
                               edgecolor=FLAG_COLOR.get(f.kind, "#6a1b9a")))
    ax.set_title(title(key))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(labelsize=7, rotation=0)


def is_image(v: HeadsView) -> bool:
    return v.n_total > IMAGE_FROM


def _panel(v: HeadsView, cell: float, pad: tuple[float, float], least: tuple[float, float]) -> tuple[float, float]:
    """Width and height of one grid in inches: `cell` per head and layer, image grids a few inches."""
    if is_image(v):
        return pad[0] + min(6.0, max(2.5, 0.06 * v.n_heads)), pad[1] + min(7.0, max(2.5, 0.06 * v.n_layers))
    return max(least[0], v.n_heads * cell + pad[0]), max(least[1], v.n_layers * cell + pad[1])


def head_grids(v: HeadsView) -> str | None:
    """Δaccuracy, Δloss, gradient importance and the statistics drawn beside them (max weight), side by side (None: no
    grid holds a finite number, e.g. a heads JSON with only layer/head, or NaN everywhere)."""
    keys = [("delta_accuracy", True), ("delta_loss", True), ("grad_importance", False),
            *((k, False) for k in drawn(v, "effect_grid"))]
    keys = [(k, d) for k, d in keys if np.isfinite(v.grids[k]).any()]
    if not keys:
        return None
    w, h = _panel(v, 0.28 if v.n_heads > 6 else 0.45, (1.4, 1.0), (2.8, 2.4))
    ncol = len(keys) if v.n_heads <= 6 else 2  # big grids two by two, so cells stay readable
    nrow = -(-len(keys) // ncol)
    with style():
        fig = new_figure(w * ncol, h * nrow, left=0.5, right=0.1, top=0.35, bottom=0.45, wspace=0.35,
                         hspace=0.35)
        axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
        for ax in axes[len(keys):]:
            ax.set_visible(False)
        for ax, (key, div) in zip(axes, keys):
            _grid(ax, v, key, div)
        return to_data_uri(fig)


def role_key() -> dict[str, tuple[str, str]]:
    """role name -> (letter, words) of every role the statistics registry names, then broad: the role
    grid's cells and its key, read at each use so that a registered role statistic is drawn too."""
    return {name: (r.letter, r.label) for name, r in {**roles(), BROAD: BROAD_ROLE}.items()}


def _role_grid(ax, v: HeadsView) -> None:
    """Each head's role (diagnose.ablation.roles) as a letter on a categorical colour."""
    key = role_key()
    names = list(key)
    codes = np.array([[names.index(r) % 10 if r in key else np.nan for r in row] for row in v.roles], dtype=float)
    big = is_image(v)
    ax.imshow(np.ma.masked_invalid(codes), cmap="tab10", vmin=0, vmax=9, aspect="auto", alpha=0.55,
              interpolation="none" if big else "antialiased")
    if big:  # no room for a letter per head: a colour key instead
        cmap = matplotlib.colormaps["tab10"]
        present = [i for i, n in enumerate(names) if (v.roles == n).any()]
        ax.legend(handles=[Patch(color=cmap(i % 10), alpha=0.55, label=key[names[i]][1]) for i in present],
                  fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        _ticks(ax, v.n_layers, v.n_heads)
        ax.set_title("role", fontsize=9)
    else:
        for (layer, head), r in np.ndenumerate(v.roles):
            if r in key:
                ax.text(head, layer, key[r][0], ha="center", va="center", fontsize=7)
        said = [f"{letter} {words}" for letter, words in key.values()]
        half = -(-len(said) // 2)
        ax.set_title("role\n" + ", ".join(said[:half]) + ",\n" + ", ".join(said[half:]), fontsize=7)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(labelsize=7)


def attention_grids(v: HeadsView) -> str | None:
    """The attention statistics shown as grids ("grid" in the registry) and each head's role, so each
    head's map can be read at a glance."""
    keys = drawn(v, "grid")
    if v.roles is not None:
        keys.append("role")
    if not keys:
        return None
    w, h = _panel(v, 0.22 if v.n_heads > 6 else 0.4, (1.3, 0.9), (2.5, 2.2))
    legend = 1.1 if is_image(v) and "role" in keys else 0.0  # the role key beside the last grid
    ncol = 3 if is_image(v) else len(keys)  # image grids are a few inches each: three to a row
    nrow = -(-len(keys) // ncol)
    with style():
        fig = new_figure(w * min(ncol, len(keys)) + legend, h * nrow, left=0.5, right=0.1 + legend, top=0.5,
                         bottom=0.45, wspace=0.35, hspace=0.35)
        axes = fig.subplots(nrow, min(ncol, len(keys)), squeeze=False).ravel()
        for ax in axes[len(keys):]:
            ax.set_visible(False)
        for ax, key in zip(axes, keys):
            _role_grid(ax, v) if key == "role" else _grid(ax, v, key, False)
        return to_data_uri(fig)


def scatter(v: HeadsView) -> str | None:
    """Attention statistic (x) against the causal effect (y), one point per head, with Spearman ρ."""
    effect = "delta_loss" if np.isfinite(v.grids["delta_loss"]).any() else "delta_accuracy"
    stats = drawn(v, "scatter")
    if not stats or not np.isfinite(v.grids[effect]).any():
        return None
    corr = {(c.statistic, c.effect): c for c in v.correlations}
    flagged = {(f.layer, f.head): f for f in v.flags}
    small = not is_image(v)
    with style():
        fig = new_figure(3.6 * len(stats), 3.2, left=0.65, top=0.55, wspace=0.4)
        axes = fig.subplots(1, len(stats), squeeze=False)[0]
        y = v.grids[effect]
        for ax, stat in zip(axes, stats):
            x = v.grids[stat]
            sig = v.matters.astype(bool)
            # thousands of points: drawn as one raster inside the SVG rather than a path each
            ax.scatter(x[~sig], y[~sig], s=14 if small else 5, c="#9e9e9e", label="other verdicts",
                       rasterized=not small)
            ax.scatter(x[sig], y[sig], s=20 if small else 8, c="#000000", label="matters", rasterized=not small)
            for kind in dict.fromkeys(f.kind for f in flagged.values()):
                at = tuple(np.array([k for k, f in flagged.items() if f.kind == kind]).T)  # (layers, heads)
                ax.scatter(x[at], y[at], s=70 if small else 30, facecolors="none", rasterized=not small,
                           edgecolors=FLAG_COLOR.get(kind, "#6a1b9a"), linewidths=1.6 if small else 1.0)
            for (layer, head), f in list(flagged.items())[:MAX_LABELLED]:  # flags come ranked
                ax.annotate(f.label, (x[layer, head], y[layer, head]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
            c = corr.get((stat, effect))
            rho = f"Spearman ρ = {c.rho:.2f} (p = {c.p_value:.2g})" if c else "ρ n/a"
            name = STATISTICS[stat].label
            ax.set_title(f"{name} vs {EFFECTS[effect]}\n{rho}")
            ax.set_xlabel(name)
            ax.set_ylabel(EFFECTS[effect])
            ax.axhline(0, color="#bdbdbd", lw=0.8, zorder=0)
        axes[0].legend(fontsize=7, loc="best")
        return to_data_uri(fig)
