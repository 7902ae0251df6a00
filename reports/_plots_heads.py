"""Head-importance pictures: causal grids beside attention-statistic grids, and the scatter of
what a heatmap shows against what removing the head does."""

from __future__ import annotations

import numpy as np
import seaborn as sns
from matplotlib.patches import Rectangle

from ._figures import new_figure, style, to_data_uri
from .view_heads import HeadsView

FLAG_COLOR = {"striking_but_inert": "#1565c0", "diffuse_but_vital": "#c62828"}
LABELS = {
    "delta_accuracy": "Δ accuracy when removed",
    "delta_loss": "Δ loss when removed",
    "grad_importance": "gradient importance",
    "max_weight": "attention: max weight",
    "entropy": "attention: entropy",
    "first_token": "attention: mass\non first token",
    "prev_token": "attention: mass\non previous token",
    "self": "attention: mass\non itself",
    "mean_distance": "attention: mean distance",
}


def _grid(ax, v: HeadsView, key: str, diverging: bool) -> None:
    data = v.grids[key]  # [n_layers, n_heads]
    finite = data[np.isfinite(data)]
    if diverging:
        lim = float(np.max(np.abs(finite))) if len(finite) else 1.0
        kw = {"cmap": "RdBu_r" if key == "delta_loss" else "RdBu", "center": 0.0,
              "vmin": -lim or -1, "vmax": lim or 1}
    else:
        kw = {"cmap": "viridis"}
    small = v.n_total <= 64
    sns.heatmap(data, ax=ax, square=v.n_heads <= 3 * v.n_layers, annot=small, fmt=".2f",
                annot_kws={"fontsize": 6}, linewidths=0.4, linecolor="white",
                cbar_kws={"shrink": 0.8}, mask=~np.isfinite(data), **kw)
    if key in ("delta_accuracy", "delta_loss"):
        for layer, head in zip(*np.nonzero(v.significant)):
            # beside the printed value on small grids, in the cell's centre on big ones
            x, y = (head + 0.82, layer + 0.24) if small else (head + 0.5, layer + 0.5)
            ax.scatter([x], [y], marker="*", s=45 if small else 40, c="black", edgecolors="white",
                       linewidths=0.6, zorder=3)
    for f in v.flags:
        ax.add_patch(Rectangle((f.head, f.layer), 1, 1, fill=False, lw=1.8,
                               edgecolor=FLAG_COLOR.get(f.kind, "#6a1b9a")))
    ax.set_title(LABELS.get(key, key))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(labelsize=7, rotation=0)


def head_grids(v: HeadsView) -> str | None:
    """Δaccuracy, Δloss, gradient importance and max attention weight, side by side (None: no
    grid holds a finite number, e.g. a heads JSON with only layer/head, or NaN everywhere)."""
    keys = [("delta_accuracy", True), ("delta_loss", True), ("grad_importance", False), ("max_weight", False)]
    keys = [(k, d) for k, d in keys if np.isfinite(v.grids[k]).any()]
    if not keys:
        return None
    cell = 0.28 if v.n_heads > 6 else 0.45
    w = max(2.8, v.n_heads * cell + 1.4)
    h = max(2.4, v.n_layers * cell + 1.0)
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


ROLE_LETTERS = {"first_token": "F", "last_token": "L", "self": "S", "prev_token": "P", "next_token": "N",
                "local": "W", "broad": "B"}
ROLE_KEY = "F first token, L last token, S itself, P previous, N next, W local window, B broad"


def _role_grid(ax, v: HeadsView) -> None:
    """Each head's role (diagnose.ablation.roles) as a letter on a categorical colour."""
    names = list(ROLE_LETTERS)
    codes = np.array([[names.index(r) if r in names else np.nan for r in row] for row in v.roles], dtype=float)
    ax.imshow(np.ma.masked_invalid(codes), cmap="tab10", vmin=0, vmax=9, aspect="auto", alpha=0.55)
    for (layer, head), r in np.ndenumerate(v.roles):
        if r in ROLE_LETTERS:
            ax.text(head, layer, ROLE_LETTERS[r], ha="center", va="center", fontsize=7)
    ax.set_title("role\n" + ROLE_KEY.replace(", W", ",\nW"), fontsize=7)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(labelsize=7)


def attention_grids(v: HeadsView) -> str | None:
    """The other attention statistics and each head's role, so each head's map can be read at a glance."""
    keys = [k for k in ("entropy", "first_token", "prev_token", "self") if np.isfinite(v.grids[k]).any()]
    if v.roles is not None:
        keys.append("role")
    if not keys:
        return None
    cell = 0.22 if v.n_heads > 6 else 0.4
    w = max(2.5, v.n_heads * cell + 1.3)
    h = max(2.2, v.n_layers * cell + 0.9)
    with style():
        fig = new_figure(w * len(keys), h, left=0.5, right=0.1, top=0.5, bottom=0.45, wspace=0.35)
        axes = fig.subplots(1, len(keys), squeeze=False)[0]
        for ax, key in zip(axes, keys):
            _role_grid(ax, v) if key == "role" else _grid(ax, v, key, False)
        return to_data_uri(fig)


def scatter(v: HeadsView) -> str | None:
    """Attention statistic (x) against the causal effect (y), one point per head, with Spearman ρ."""
    effect = "delta_loss" if np.isfinite(v.grids["delta_loss"]).any() else "delta_accuracy"
    stats = [s for s in ("max_weight", "first_token", "entropy") if np.isfinite(v.grids[s]).any()]
    if not stats or not np.isfinite(v.grids[effect]).any():
        return None
    corr = {(c.statistic, c.effect): c for c in v.correlations}
    flagged = {(f.layer, f.head): f for f in v.flags}
    with style():
        fig = new_figure(3.6 * len(stats), 3.2, left=0.65, top=0.55, wspace=0.4)
        axes = fig.subplots(1, len(stats), squeeze=False)[0]
        y = v.grids[effect]
        for ax, stat in zip(axes, stats):
            x = v.grids[stat]
            sig = v.significant
            ax.scatter(x[~sig], y[~sig], s=14, c="#9e9e9e", label="not significant")
            ax.scatter(x[sig], y[sig], s=20, c="#000000", label="significant")
            for (layer, head), f in flagged.items():
                ax.scatter([x[layer, head]], [y[layer, head]], s=70, facecolors="none",
                           edgecolors=FLAG_COLOR.get(f.kind, "#6a1b9a"), linewidths=1.6)
                ax.annotate(f.label, (x[layer, head], y[layer, head]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
            c = corr.get((stat, effect))
            rho = f"Spearman ρ = {c.rho:.2f} (p = {c.p_value:.2g})" if c else "ρ n/a"
            name = LABELS[stat].split(": ")[-1].replace("\n", " ")
            ax.set_title(f"{name} vs {LABELS[effect]}\n{rho}")
            ax.set_xlabel(name)
            ax.set_ylabel(LABELS[effect])
            ax.axhline(0, color="#bdbdbd", lw=0.8, zorder=0)
        axes[0].legend(fontsize=7, loc="best")
        return to_data_uri(fig)
