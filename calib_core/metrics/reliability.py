"""Reliability diagrams as PNG files, headless (matplotlib's Agg canvas, no pyplot state).

Top panel: per-bin accuracy bars against confidence, the gap to the bin's mean confidence
in red, the diagonal of perfect calibration, ECE in the title. Bottom panel: histogram of
the top-label confidences (counts per bin) with the mean confidence and accuracy marked.
The bins are those of :func:`calib_core.metrics.ece` (even, top label); predictions with
confidence exactly 1.0, which ECE keeps in a bin of their own, are drawn in the last bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ._inputs import check_num_bins, prepare
from .calibration_error import _error, binned_stats

__all__ = ["reliability_diagram"]


def reliability_diagram(
    probs: Any,
    labels: Any,
    path: str | Path,
    *,
    num_bins: int = 15,
    title: str | None = None,
    from_logits: bool = False,
) -> Path:
    """Draw the reliability diagram of top-label predictions and write it to ``path`` (PNG).

    Parent folders are created. Returns the path written.
    """
    num_bins = check_num_bins(num_bins)
    x = prepare(probs, labels, from_logits=from_logits)
    (stats,) = binned_stats(
        x, num_bins=num_bins, binning="even", top_label=True, class_conditional=False, thresholds=[0.0]
    )
    ece_value = float(_error(stats, "l1", False, x.num_classes))
    counts, conf_sums, correct_sums = (s[0].cpu().numpy().copy() for s in stats)
    # fold the p == 1.0 bin into the last drawn bar
    for arr in (counts, conf_sums, correct_sums):
        arr[-2] += arr[-1]
    counts, conf_sums, correct_sums = counts[:-1], conf_sums[:-1], correct_sums[:-1]
    nonempty = counts > 0
    acc = np.divide(correct_sums, counts, out=np.zeros_like(counts), where=nonempty)
    conf = np.divide(conf_sums, counts, out=np.zeros_like(counts), where=nonempty)

    fig = Figure(figsize=(5.5, 7.0), dpi=110)
    FigureCanvasAgg(fig)
    ax, hx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    heading = f"{title}\n" if title else ""
    _draw_bins(ax, acc, conf, nonempty, num_bins)
    ax.set_title(f"{heading}ECE = {ece_value:.4f}  ({num_bins} bins, N = {x.n})", fontsize=10)
    _draw_counts(hx, counts, conf_sums, correct_sums, num_bins)
    _lay_out(fig, hx, ax.get_title())

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


# tight_layout's margins by what they depend on here (the title's lines and the count axis' tick labels; the rest of
# the figure is fixed): most of a sweep's diagrams share them, and tight_layout is a third of a diagram's drawing
_MARGINS: dict[tuple[Any, ...], tuple[float, float, float, float, float, float]] = {}


def _lay_out(fig: Any, hx: Any, title: str) -> None:
    """The figure's subplot margins as `fig.tight_layout()` sets them, computed once per layout key; no layout engine
    left behind (savefig would draw the figure once more for it)."""
    ticks = hx.yaxis.get_major_locator()()
    labels = hx.yaxis.get_major_formatter().format_ticks(ticks)
    key = (
        tuple(len(line) for line in title.splitlines()),
        max(map(len, labels), default=0),
        hx.yaxis.get_offset_text().get_text(),
    )
    margins = _MARGINS.get(key)
    if margins is None:
        fig.tight_layout()
        sp = fig.subplotpars
        margins = _MARGINS.setdefault(key, (sp.left, sp.right, sp.top, sp.bottom, sp.wspace, sp.hspace))
    left, right, top, bottom, wspace, hspace = margins
    fig.set_layout_engine(None)
    fig.subplots_adjust(left=left, right=right, top=top, bottom=bottom, wspace=wspace, hspace=hspace)


def _draw_bins(ax: Any, acc: np.ndarray, conf: np.ndarray, nonempty: np.ndarray, num_bins: int) -> None:
    """The upper panel: each non-empty bin's accuracy, its gap to the bin's mean confidence, and the diagonal."""
    width = 1.0 / num_bins
    left = np.arange(num_bins) * width
    ax.bar(
        left[nonempty],
        acc[nonempty],
        width=width,
        align="edge",
        color="#3b75af",
        edgecolor="black",
        linewidth=0.6,
        label="accuracy",
    )
    gap_bottom = np.minimum(acc, conf)
    gap_height = np.abs(conf - acc)
    ax.bar(
        left[nonempty],
        gap_height[nonempty],
        bottom=gap_bottom[nonempty],
        width=width,
        align="edge",
        color="#d62728",
        alpha=0.35,
        edgecolor="#d62728",
        hatch="//",
        linewidth=0.6,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1.0, label="perfect calibration")
    ax.plot(conf[nonempty], acc[nonempty], "o", color="black", markersize=3, label="(mean conf., acc.) per bin")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)


def _draw_counts(hx: Any, counts: np.ndarray, conf_sums: np.ndarray, correct_sums: np.ndarray, num_bins: int) -> None:
    """The lower panel: rows per bin, with the mean confidence and the accuracy as vertical lines."""
    width = 1.0 / num_bins
    centers = np.arange(num_bins) * width + width / 2
    hx.bar(centers, counts, width=width * 0.9, color="#7f7f7f", edgecolor="black", linewidth=0.5)
    mean_conf = float(conf_sums.sum() / max(counts.sum(), 1))
    mean_acc = float(correct_sums.sum() / max(counts.sum(), 1))
    hx.axvline(mean_conf, color="#d62728", linestyle="--", linewidth=1.0, label=f"mean confidence {mean_conf:.3f}")
    hx.axvline(mean_acc, color="#3b75af", linestyle="-", linewidth=1.0, label=f"accuracy {mean_acc:.3f}")
    hx.set_xlabel("confidence (top-label probability)")
    hx.set_ylabel("count")
    hx.legend(loc="upper left", fontsize=7)
