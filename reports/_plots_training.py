"""Training-health pictures; every time axis carries the run's alerts at their steps, numbered
like the alert table beneath them."""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps

from ._figures import SEVERITY_COLOR, new_figure, style, to_data_uri
from ._view_training import TrainingView

WIDTH = 11.0
MAX_TICKS = 500  # occurrences of one alert kind drawn as ticks along the bottom


def _alerts(ax, v: TrainingView, label: bool) -> None:
    """First occurrence: dashed line + number; every occurrence: a tick on the x axis."""
    by_kind: dict[str, list[int]] = {}
    for a in v.alerts:
        s = a.get("step")
        if isinstance(s, (int, float)) and math.isfinite(s):
            by_kind.setdefault(str(a.get("kind")), []).append(s)
    for g in v.alert_groups:
        if g.first_step is None:
            continue
        color = SEVERITY_COLOR.get(g.severity, "#6a1b9a")
        ax.axvline(g.first_step, color=color, ls="--", lw=1.0, alpha=0.9)
        steps = by_kind.get(g.kind, [])[:MAX_TICKS]
        if steps:
            ax.plot(steps, [0.0] * len(steps), "|", color=color, ms=7, transform=ax.get_xaxis_transform(),
                    clip_on=False)
        if label:
            ax.text(g.first_step, 1.0, f" {g.number}", color=color, fontsize=8, fontweight="bold",
                    va="bottom", ha="left", transform=ax.get_xaxis_transform(), clip_on=False)


def _line(ax, series, **kw) -> bool:
    x, y = series
    if not np.isfinite(y).any():
        return False
    ax.plot(x, y, lw=0.9, **kw)
    return True


def _log_if_positive(ax, *series) -> None:
    """Log scale when every value is positive and they span more than a decade."""
    ys = np.concatenate([s[1][np.isfinite(s[1])] for s in series]) if series else np.zeros(0)
    if len(ys) and (ys > 0).all() and ys.max() / ys.min() > 10:
        ax.set_yscale("log")


def _bad_spans(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
    """(first, last) x of each stretch of non-finite y."""
    bad = ~np.isfinite(y)
    edge = np.diff(np.concatenate([[0], bad.astype(np.int8), [0]]))
    return [(x[a], x[b - 1]) for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1))]


def loss_lr(v: TrainingView) -> str:
    with style():
        fig = new_figure(WIDTH, 4.2, hspace=0.12)
        ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
        _line(ax_loss, v.loss, color="#1565c0")
        # where the loss is NaN/inf the line breaks: shade those steps so the gap is explained
        for i, (a, b) in enumerate(_bad_spans(*v.loss)):
            ax_loss.axvspan(a, max(b, a + 0.5), color="#c62828", alpha=0.15, lw=0,
                            label="loss not finite" if i == 0 else None)
        if _bad_spans(*v.loss):
            ax_loss.legend(fontsize=7, loc="upper right")
        ax_loss.set_ylabel("loss")
        if not _line(ax_lr, v.lr, color="#2e7d32"):
            ax_lr.text(0.5, 0.5, "no learning rate logged", ha="center", transform=ax_lr.transAxes)
        ax_lr.set_ylabel("learning rate")
        ax_lr.set_xlabel("step")
        _alerts(ax_loss, v, True)
        _alerts(ax_lr, v, False)
        return to_data_uri(fig)


def grad_norms(v: TrainingView) -> str:
    with style():
        fig = new_figure(WIDTH, 5.0, hspace=0.12, right=1.3)
        ax_g, ax_l = fig.subplots(2, 1, sharex=True)
        _line(ax_g, v.grad_norm, color="#000000")
        _log_if_positive(ax_g, v.grad_norm)
        ax_g.set_ylabel("global grad norm")
        cmap = colormaps["viridis"]
        n = max(1, len(v.layer_grad) - 1)
        for i, (name, series) in enumerate(v.layer_grad.items()):
            _line(ax_l, series, color=cmap(0.85 * i / n), label=name)  # the palest yellow is unreadable
        if v.layer_grad:
            _log_if_positive(ax_l, *v.layer_grad.values())
        if len(v.layer_grad) > 16:
            ax_l.text(1.01, 1.0, "colour = depth\n(dark = input)", fontsize=6, va="top", transform=ax_l.transAxes)
        elif v.layer_grad:
            ax_l.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="layer\n(input → output)",
                        title_fontsize=6, frameon=False)
        ax_l.set_ylabel("per-layer grad norm")
        ax_l.set_xlabel("step")
        _alerts(ax_g, v, True)
        _alerts(ax_l, v, False)
        return to_data_uri(fig)


def _depth(ax, fig, mat, v: TrainingView, title: str, cmap: str, vmin=None, vmax=None) -> None:
    x, m = mat  # x [bins], m [bins, layers]
    step = (x[1] - x[0]) if len(x) > 1 else 1.0
    im = ax.imshow(m.T, aspect="auto", origin="lower", cmap=cmap, interpolation="nearest",
                   extent=(x[0] - step / 2, x[-1] + step / 2, -0.5, m.shape[1] - 0.5), vmin=vmin, vmax=vmax)
    fig.colorbar(im, ax=ax, shrink=0.9)
    names = v.layer_names
    stride = max(1, len(names) // 12)
    ax.set_yticks(range(0, len(names), stride), [names[i] for i in range(0, len(names), stride)], fontsize=6)
    ax.set_title(title)
    ax.set_ylabel("layer (depth)")
    _alerts(ax, v, False)


def depth_over_time(v: TrainingView) -> str | None:
    """log10 activation variance and token cosine similarity, layers (rows) through time."""
    mats = [(m, t, c, lo, hi) for m, t, c, lo, hi in (
        (v.act_var, "activation variance (log10) through depth", "magma", None, None),
        (v.token_cos, "mean cosine similarity between token positions (1 = rank collapse)", "cividis", 0.0, 1.0),
    ) if m is not None and np.isfinite(m[1]).any()]
    if not mats:
        return None
    with style():
        fig = new_figure(WIDTH, 1.0 + (1.2 + 0.1 * len(v.layer_names)) * len(mats), left=1.1, hspace=0.35)
        axes = fig.subplots(len(mats), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (m, title, cmap, lo, hi) in zip(axes, mats):
            _depth(ax, fig, m, v, title, cmap, lo, hi)
        axes[-1].set_xlabel("step")
        return to_data_uri(fig)


def entropy(v: TrainingView) -> str | None:
    """Per-head attention entropy over time: one row per head, grouped by attention site."""
    e = v.entropy
    if e is None or not np.isfinite(e.values).any():
        return None
    n_rows = len(e.rows)
    x = e.steps
    step = (x[1] - x[0]) if len(x) > 1 else 1.0
    with style():
        fig = new_figure(WIDTH, 1.3 + min(5.0, max(1.2, 0.05 * n_rows)), left=1.4, right=1.0)
        ax = fig.subplots()
        im = ax.imshow(e.values.T, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                       extent=(x[0] - step / 2, x[-1] + step / 2, -0.5, n_rows - 0.5))
        fig.colorbar(im, ax=ax, pad=0.01, label="entropy (nats)")
        starts = [i for i, (site, _) in enumerate(e.rows) if i == 0 or e.rows[i - 1][0] != site]
        ends = starts[1:] + [n_rows]
        for s in starts[1:]:
            ax.axhline(s - 0.5, color="white", lw=0.8)
        stride = max(1, len(starts) // 16)
        ax.set_yticks([(a + b - 1) / 2 for a, b in zip(starts, ends)][::stride],
                      [e.rows[a][0] for a in starts][::stride], fontsize=6)
        ax.set_ylabel("head, grouped by attention layer")
        ax.set_xlabel("step")
        _alerts(ax, v, True)
        return to_data_uri(fig)
