"""Training-health pictures; every time axis carries the run's alerts at their steps, numbered
like the alert table beneath them.

Every figure has the same width and the same left and right margins (colour bars and legends
sit in the right margin, outside the axes), and every axis spans the report's shared step range
(`TrainingView.xlim`): an alert's dashed line falls at the same place in every picture.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps

from ._figures import SEVERITY_COLOR, new_figure, style, to_data_uri
from ._view_training import TrainingView, column_edges

WIDTH = 11.0
LEFT, RIGHT = 1.4, 1.7  # inches: the same in every training figure, so the step axes line up
MAX_TICKS = 500  # occurrences of one alert kind drawn as ticks along the bottom
RUN_COLORS = ("#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#ad1457")


def _figure(height: float, **kw):
    return new_figure(WIDTH, height, left=LEFT, right=RIGHT, **kw)


def _alerts(ax, v: TrainingView, label: bool, color: str | None = None) -> None:
    """First occurrence: dashed line + number; every occurrence: a tick on the x axis.
    color: one colour for all of this run's alerts (runs overlaid), else by severity."""
    by_kind: dict[str, list[int]] = {}
    for a in v.alerts:
        s = a.get("step")
        if isinstance(s, (int, float)) and math.isfinite(s):
            by_kind.setdefault(str(a.get("kind")), []).append(s)
    for g in v.alert_groups:
        if g.first_step is None:
            continue
        c = color or SEVERITY_COLOR.get(g.severity, "#6a1b9a")
        ax.axvline(g.first_step, color=c, ls="--", lw=1.0, alpha=0.9)
        steps = by_kind.get(g.kind, [])[:MAX_TICKS]
        if steps:
            ax.plot(steps, [0.0] * len(steps), "|", color=c, ms=7, transform=ax.get_xaxis_transform(),
                    clip_on=False)
        if label:
            ax.text(g.first_step, 1.0, f" {v.prefix}{g.number}", color=c, fontsize=8, fontweight="bold",
                    va="bottom", ha="left", transform=ax.get_xaxis_transform(), clip_on=False)


def _line(ax, series, **kw) -> bool:
    if series is None:
        return False
    x, y = series
    if not np.isfinite(y).any():
        return False
    ax.plot(x, y, lw=0.9, **kw)
    return True


def _log_if_positive(ax, *series) -> None:
    """Log scale when every value is positive and they span more than a decade."""
    series = [s for s in series if s is not None]
    ys = np.concatenate([s[1][np.isfinite(s[1])] for s in series]) if series else np.zeros(0)
    if len(ys) and (ys > 0).all() and ys.max() / ys.min() > 10:
        ax.set_yscale("log")


def _bad_spans(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
    """(first, last) x of each stretch of non-finite y."""
    bad = ~np.isfinite(y)
    edge = np.diff(np.concatenate([[0], bad.astype(np.int8), [0]]))
    return [(x[a], x[b - 1]) for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1))]


def _legend(ax, title: str | None = None) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title=title,
                  title_fontsize=7)


def _loss_panel(ax, v: TrainingView, color: str, name: str | None = None) -> None:
    """Training loss, eval loss (dots), the steps where the loss was not finite, saved spike batches."""
    _line(ax, v.loss, color=color, label=f"{name}: train" if name else "train loss")
    ev = v.evals
    if ev is not None and np.isfinite(ev.loss).any():
        ax.plot(ev.steps, ev.loss, "o--", color=color, ms=3.5, lw=0.8, alpha=0.85,
                label=f"{name}: eval" if name else "eval loss")
    for i, (a, b) in enumerate(_bad_spans(*v.loss)):
        ax.axvspan(a, max(b, a + 0.5), color=color if name else "#c62828", alpha=0.15, lw=0,
                   label=(f"{name}: " if name else "") + "loss not finite" if i == 0 else None)
    if v.spikes:
        ax.plot([s.step for s in v.spikes], [1.0] * len(v.spikes), "v", color=color, ms=6,
                transform=ax.get_xaxis_transform(), clip_on=False,
                label=(f"{name}: " if name else "") + "spike batch saved")


def _grad_panel(ax, v: TrainingView, color: str, name: str | None = None) -> None:
    _line(ax, v.grad_norm, color=color, label=f"{name}" if name else "pre-clip norm")
    c = v.clipping
    if c is not None and c.clip is not None:
        share = f" ({c.share:.0%} scaled)" if c.share is not None else ""
        ax.axhline(c.clip, color=color, ls=":", lw=1.0,
                   label=(f"{name}: " if name else "") + f"clip {c.clip:.3g}{share}")


def loss_lr(v: TrainingView) -> str:
    with style():
        fig = _figure(4.2, hspace=0.12)
        ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
        _loss_panel(ax_loss, v, "#1565c0")
        _legend(ax_loss)
        ax_loss.set_ylabel("loss")
        if not _line(ax_lr, v.lr, color="#2e7d32"):
            ax_lr.text(0.5, 0.5, "no learning rate logged", ha="center", transform=ax_lr.transAxes)
        ax_lr.set_ylabel("learning rate")
        ax_lr.set_xlabel("step")
        ax_lr.set_xlim(*v.xlim)
        _alerts(ax_loss, v, True)
        _alerts(ax_lr, v, False)
        return to_data_uri(fig)


def grad_norms(v: TrainingView) -> str:
    with style():
        fig = _figure(5.0, hspace=0.12)
        ax_g, ax_l = fig.subplots(2, 1, sharex=True)
        _grad_panel(ax_g, v, "#000000")
        _log_if_positive(ax_g, v.grad_norm)
        _legend(ax_g)
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
        ax_l.set_xlim(*v.xlim)
        _alerts(ax_g, v, True)
        _alerts(ax_l, v, False)
        return to_data_uri(fig)


def throughput(v: TrainingView) -> str | None:
    """Tokens per second and seconds per step, where the run logged them: slowdowns show."""
    panels = [(s, label, c) for s, label, c in ((v.tokens_per_s, "tokens / s", "#00838f"),
                                                (v.step_time, "seconds / step", "#5d4037")) if s is not None]
    if not panels:
        return None
    with style():
        fig = _figure(1.2 + 1.4 * len(panels), hspace=0.12)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (series, label, color) in zip(axes, panels):
            _line(ax, series, color=color)
            ax.set_ylabel(label)
            _alerts(ax, v, ax is axes[0])
        axes[-1].set_xlabel("step")
        axes[-1].set_xlim(*v.xlim)
        return to_data_uri(fig)


def curve(v: TrainingView, label: str, series) -> str:
    """One model-level field over the steps, where its declaration asks for a plot (TrainingView.curves: only
    the steps that hold a finite value, at least one)."""
    with style():
        fig = _figure(2.2)
        ax = fig.subplots()
        _line(ax, series, color="#6a1b9a", marker="o" if len(series[0]) <= 100 else None, ms=2.5)
        _log_if_positive(ax, series)
        ax.set_ylabel(label)
        ax.set_xlabel("step")
        ax.set_xlim(*v.xlim)
        _alerts(ax, v, True)
        return to_data_uri(fig)


def eval_metrics(v: TrainingView) -> str | None:
    """Each evaluation metric other than the loss (the loss is on the loss panel)."""
    if v.evals is None or not v.evals.metrics:
        return None
    with style():
        fig = _figure(2.6)
        ax = fig.subplots()
        cmap = colormaps["tab10"]
        for i, (name, values) in enumerate(v.evals.metrics.items()):
            ax.plot(v.evals.steps, values, "o-", ms=3.5, lw=0.9, color=cmap(i % 10), label=name)
        _legend(ax, "eval metric")
        ax.set_xlabel("step")
        ax.set_xlim(*v.xlim)
        _alerts(ax, v, True)
        return to_data_uri(fig)


def _colorbar(fig, ax, im, label: str):
    """A colour bar in the right margin, leaving the axes' width (and step axis) as it is."""
    box = ax.get_position()
    cax = fig.add_axes((box.x1 + 0.15 / WIDTH, box.y0, 0.12 / WIDTH, box.height))
    return fig.colorbar(im, cax=cax, label=label)


def _depth(ax, fig, mat, v: TrainingView, title: str, cmap: str, vmin=None, vmax=None) -> None:
    x, m = mat  # x [bins] (the step each column starts at), m [bins, layers]
    im = ax.pcolormesh(column_edges(x, v.last_step), np.arange(m.shape[1] + 1) - 0.5, m.T, cmap=cmap,
                       vmin=vmin, vmax=vmax, shading="flat", rasterized=True)
    _colorbar(fig, ax, im, "")
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
        fig = _figure(1.0 + (1.2 + 0.1 * len(v.layer_names)) * len(mats), hspace=0.35)
        axes = fig.subplots(len(mats), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (m, title, cmap, lo, hi) in zip(axes, mats):
            _depth(ax, fig, m, v, title, cmap, lo, hi)
        axes[-1].set_xlabel("step")
        axes[-1].set_xlim(*v.xlim)
        return to_data_uri(fig)


def depth_map(v: TrainingView, label: str, mat) -> str | None:
    """Another per-block field through depth over time (its declaration asks for a plot)."""
    if not np.isfinite(mat[1]).any():
        return None
    with style():
        fig = _figure(1.0 + 1.2 + 0.1 * len(v.layer_names))
        ax = fig.subplots()
        _depth(ax, fig, mat, v, f"{label} through depth", "viridis")
        ax.set_xlabel("step")
        ax.set_xlim(*v.xlim)
        return to_data_uri(fig)


def entropy(v: TrainingView) -> str | None:
    """Per-head attention entropy over time: one row per head, grouped by attention site. Each
    sample is drawn from the step it was taken at until the next one, on an absolute scale from 0
    to the entropy of uniform attention (log T, marked on the colour bar)."""
    e = v.entropy
    if e is None or not np.isfinite(e.values).any():
        return None
    return _per_head(v, e, 0.0, 1.05 * max(float(np.nanmax(e.values)), e.uniform or 0.0))


def head_map(v: TrainingView, e) -> str | None:
    """Another per-head field over time (its declaration asks for a plot: the max logit, a
    registered measurement's), drawn as the entropy is, on the range of its finite values."""
    finite = e.values[np.isfinite(e.values)]
    if not len(finite):
        return None
    return _per_head(v, e, float(finite.min()), float(finite.max()))


def _per_head(v: TrainingView, e, vmin: float, vmax: float) -> str:
    n_rows = len(e.rows)
    with style():
        fig = _figure(1.3 + min(5.0, max(1.2, 0.05 * n_rows)))
        ax = fig.subplots()
        im = ax.pcolormesh(column_edges(e.steps, v.last_step),
                           np.arange(n_rows + 1) - 0.5, e.values.T, cmap="viridis", vmin=vmin, vmax=vmax,
                           shading="flat", rasterized=True)
        bar = _colorbar(fig, ax, im, e.label)
        if e.uniform:  # a red line across the colour bar, inside it: the scale reaches 5 % above
            bar.ax.axhline(e.uniform, color="#c62828", lw=2.0)
            bar.ax.set_title(f"red: uniform\nlog T = {e.uniform:.2f}", fontsize=6, color="#c62828", loc="left")
        starts = [i for i, (site, _) in enumerate(e.rows) if i == 0 or e.rows[i - 1][0] != site]
        ends = starts[1:] + [n_rows]
        for s in starts[1:]:
            ax.axhline(s - 0.5, color="white", lw=0.8)
        stride = max(1, len(starts) // 16)
        ax.set_yticks([(a + b - 1) / 2 for a, b in zip(starts, ends)][::stride],
                      [e.rows[a][0] for a in starts][::stride], fontsize=6)
        ax.set_ylabel("head, by attention layer")
        ax.set_xlabel("step")
        ax.set_xlim(*v.xlim)
        _alerts(ax, v, True)
        return to_data_uri(fig)


def compare(views: list[TrainingView]) -> str:
    """Several runs overlaid on shared axes: loss (eval dots), lr, global grad norm (clip lines),
    tokens/s where logged; each run in its colour, its alerts as dashed lines in that colour."""
    with style():
        has_tps = any(v.tokens_per_s is not None for v in views)
        n = 4 if has_tps else 3
        fig = _figure(1.0 + 2.0 * n, hspace=0.12)
        axes = fig.subplots(n, 1, sharex=True, height_ratios=[2, 1, 1.3] + ([1] if has_tps else []))
        for v in views:
            _loss_panel(axes[0], v, v.color, v.name)
            _line(axes[1], v.lr, color=v.color)
            _grad_panel(axes[2], v, v.color, v.name)
            if has_tps:
                _line(axes[3], v.tokens_per_s, color=v.color)
            for ax in axes:
                _alerts(ax, v, ax is axes[0], v.color)
        _log_if_positive(axes[2], *(v.grad_norm for v in views))
        _legend(axes[0], "run")
        _legend(axes[2])
        for ax, label in zip(axes, ("loss", "learning rate", "global grad norm", "tokens / s")):
            ax.set_ylabel(label)
        axes[-1].set_xlabel("step")
        axes[-1].set_xlim(*views[0].xlim)
        return to_data_uri(fig)
