"""Heads over training, drawn: one small importance map per attention layer (heads x sampled steps, one
colour scale for all), and the loss with each head event marked at its step, above one line per head that
matters at the end. On the report's shared step axis and margins, like every training picture."""

from __future__ import annotations

import numpy as np

from ._figures import style, to_data_uri
from ._plots_training import _alerts, _colorbar, _figure, _line
from ._view_heads_training import HeadsOverTraining
from ._view_training import TrainingView, column_edges

EVENT_COLOR = "#6a1b9a"
EVENT_WORDS = {"head_vital": "vital", "induction_head": "induction", "induction_phase_change": "phase change"}


def importance_maps(v: TrainingView, h: HeadsOverTraining) -> str | None:
    """Every head's importance at every sampled step: one map per layer, rows its heads."""
    finite = np.concatenate([m[np.isfinite(m)] for _, m in h.layers])
    if not len(finite):
        return None
    vmax = float(finite.max()) or 1.0
    with style():
        fig = _figure(0.9 + sum(0.35 + 0.12 * m.shape[1] for _, m in h.layers), hspace=0.6)
        axes = fig.subplots(len(h.layers), 1, sharex=True, squeeze=False)[:, 0]
        edges = column_edges(h.steps, v.last_step)
        for layer, (ax, (site, m)) in enumerate(zip(axes, h.layers)):  # m [S, heads]
            im = ax.pcolormesh(edges, np.arange(m.shape[1] + 1) - 0.5, m.T, cmap="viridis", vmin=0.0, vmax=vmax,
                               shading="flat", rasterized=True)
            ax.set_yticks(range(m.shape[1]), [f"H{i}" for i in range(m.shape[1])], fontsize=6)
            ax.set_title(f"L{layer} ({site})", fontsize=8, loc="left")
            _alerts(ax, v, False)
        _colorbar(fig, axes[0], im, "importance")
        axes[-1].set_xlabel("step")
        axes[-1].set_xlim(*v.xlim)
        return to_data_uri(fig)


def _mark_events(ax, h: HeadsOverTraining, label: bool) -> None:
    for i, e in enumerate(h.events):
        ax.axvline(e.step, color=EVENT_COLOR, ls=":", lw=1.0)
        if label:
            words = EVENT_WORDS.get(e.kind, e.kind)
            text = words if e.where == "model" else f"{e.where} {words}"
            ax.text(e.step, 0.97 - 0.09 * (i % 5), f" {text}", color=EVENT_COLOR, fontsize=7, va="top",
                    transform=ax.get_xaxis_transform())


def loss_and_heads(v: TrainingView, h: HeadsOverTraining) -> str:
    """The loss with the head events marked (dotted, named), and the importance of the heads that matter
    at the end, one line each."""
    with style():
        fig = _figure(4.6, hspace=0.12)
        ax_loss, ax_imp = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
        _line(ax_loss, v.loss, color="#1565c0", label="train loss")
        ax_loss.set_ylabel("loss")
        _mark_events(ax_loss, h, True)
        for label, values in h.lines:
            ok = np.isfinite(values)
            ax_imp.plot(h.steps[ok], values[ok], "o-", ms=2.5, lw=1.0, label=label)
        _mark_events(ax_imp, h, False)
        ax_imp.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        ax_imp.set_ylabel("importance")
        ax_imp.set_xlabel("step")
        ax_imp.set_xlim(*v.xlim)
        return to_data_uri(fig)
