"""General calibration error (Nixon et al. 2019) and its named presets.

``calibration_error`` exposes every knob of the paper; the presets fix them:

=============  ========  ===========  =================  ====  =========
metric         binning   values       grouping           norm  threshold
=============  ========  ===========  =================  ====  =========
ECE            even      top label    pooled             l1    0
MCE            even      top label    pooled             max   0
RMSCE          adaptive  top label    pooled             l2    0
SCE            even      all classes  class-conditional  l1    0
ACE            adaptive  all classes  class-conditional  l1    0
TACE           adaptive  all classes  class-conditional  l1    0.01
classwise-ECE  even      all classes  class-conditional  l1    None
=============  ========  ===========  =================  ====  =========

Conventions (see :mod:`calib_core.metrics.binning` for the bins):

* threshold t keeps only probabilities p > t, strictly; a bin's weight is its count over
  the size of its group *after* thresholding; empty bins add 0; ``threshold=None`` keeps all.
  Note that t = 0 (the default, as in the reference library) drops probabilities that are
  exactly 0.
* class-conditional: one group per class, errors summed and divided by K (the number of
  columns), even for classes with no samples. With ``top_label=True`` the rows are grouped by
  their (first) argmax; with ``top_label=False`` class k's group is column k.
* pooled, ``top_label=False``: all N*K probabilities in one group, correctness = one-hot label.
* ``norm="l2"``: sqrt(sum_b w_b (acc_b - conf_b)^2), the root taken once at the end, after
  averaging classes (the corrected reference; PyPI uncertainty-metrics 0.0.81 squares the
  *weighted* gap instead). ``norm="max"``: the largest |acc_b - conf_b| over non-empty bins
  (MCE); class-conditional max averages the per-class maxima.
* classwise-ECE (Kull et al. 2019): (1/K) sum_k sum_b |B_kb|/N |acc_kb - conf_kb| over *all*
  N predictions of each class, i.e. SCE without the p > 0 filter. It equals SCE whenever no
  probability is exactly 0. The reference library has no classwise-ECE; its ``gce`` with
  ``threshold < 0`` computes the same number.

Numbers match the reference numpy ``gce`` of google/uncertainty-metrics to 1e-6 in float64
for every l1 configuration (tests/unit/calib_core/test_metrics_reference.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import _fast
from . import binning as _binning
from ._inputs import BINNINGS, NORMS, MetricInputs, check_bool, check_choice, check_num_bins, check_threshold, prepare
from .binning import (
    AdaptiveStats,
    EvenBinner,
    adaptive_bin_index,
    adaptive_stats_1d,
    adaptive_stats_rows,
    bincount,
    combine,
    even_sub_stats_1d,
    even_sub_stats_2d,
    floor_threshold,
    group_errors,
    sort_values,
)

BinStats = tuple[Tensor, Tensor, Tensor]  # (counts, confidence sums, correctness sums), (G, bins) float64

__all__ = ["calibration_error", "ece", "mce", "rmsce", "sce", "ace", "tace", "classwise_ece", "binned_stats"]


def _with_correct(stats: list[AdaptiveStats]) -> list[BinStats]:
    """(counts, sums, correctness sums) of adaptive statistics that were given correctness."""
    out: list[BinStats] = []
    for s in stats:
        assert s.correct is not None  # adaptive_stats_1d always fills it from its ``correct`` argument
        out.append((s.counts, s.sums, s.correct))
    return out


def binned_stats(
    x: MetricInputs,
    *,
    num_bins: int,
    binning: str,
    top_label: bool,
    class_conditional: bool,
    thresholds: Sequence[float | None],
) -> list[BinStats]:
    """Per-group, per-bin statistics for one knob setting and several thresholds at once.

    Groups: 1 when pooled, K when class-conditional. One pass over the data serves all
    thresholds (even: extra bucketize boundaries; adaptive: the same sort).
    """
    k = x.num_classes
    g = k if class_conditional else 1
    if top_label:
        conf, pred = x.top()
        correct = x.correct()
        groups = pred if class_conditional else None
        if binning == "even":
            binner = EvenBinner(num_bins, thresholds, x.dtype, x.device)
            cnt, sums, corr = even_sub_stats_1d(binner, conf, groups, g, weights=correct)
            assert corr is not None  # weight sums come back when weights are given
            return [
                (binner.collapse(cnt, i), binner.collapse(sums, i), binner.collapse(corr, i))
                for i in range(len(thresholds))
            ]
        stats = adaptive_stats_1d(conf, correct, thresholds, num_bins, groups, g, presorted=x.sorted_conf())
        return _with_correct(stats)

    probs, labels, p_true = x.probs, x.labels, x.p_true()
    true_groups = labels if class_conditional else None
    if binning == "even":
        binner = EvenBinner(num_bins, thresholds, x.dtype, x.device)
        cnt, sums = even_sub_stats_2d(binner, probs, columns=class_conditional)
        corr, _, _ = even_sub_stats_1d(binner, p_true, true_groups, g)
        return [
            (binner.collapse(cnt, i), binner.collapse(sums, i), binner.collapse(corr, i))
            for i in range(len(thresholds))
        ]

    if not class_conditional:  # all N*K values in one group: correctness is the one-hot label
        onehot = labels.unsqueeze(1) == torch.arange(k, device=x.device)
        stats = adaptive_stats_1d(probs.reshape(-1), onehot.reshape(-1), thresholds, num_bins)
        return _with_correct(stats)

    # adaptive, class-conditional over columns: compiled per-column selection of the edges
    # (float32 CPU), else sort column blocks, bins are position ranges
    if probs.dtype == torch.float32 and _fast.usable(probs):
        floors = [floor_threshold(t, x.dtype) for t in thresholds]
        fast = _fast.adaptive_columns(probs, p_true, labels, floors, num_bins)
        if fast is not None:
            cnt_t, sums_t, corr_t, _, _ = fast
            return [(cnt_t[i], sums_t[i], corr_t[i]) for i in range(len(thresholds))]
    parts: list[list] = [[] for _ in thresholds]
    block = max(1, _binning.CHUNK_ELEMENTS // max(x.n, 1))
    for c0 in range(0, k, block):
        rows = sort_values(probs[:, c0 : c0 + block].t().contiguous())
        for part, s in zip(parts, adaptive_stats_rows(rows, thresholds, num_bins), strict=True):
            part.append(s)
        del rows
    out = []
    for t, part in zip(thresholds, parts, strict=True):
        counts = torch.cat([s.counts for s in part])
        sums = torch.cat([s.sums for s in part])
        edges = torch.cat([s.edges for s in part])
        idx = labels * num_bins + adaptive_bin_index(p_true, edges, labels)
        idx = torch.where(p_true > floor_threshold(t, x.dtype), idx, k * num_bins)
        corr = bincount(idx, minlength=k * num_bins + 1)[:-1].view(k, num_bins)
        out.append((counts, sums, corr))
    return out


def _error(stats: BinStats, norm: str, class_conditional: bool, num_classes: int) -> Tensor:
    return combine(group_errors(*stats, norm), norm, class_conditional, num_classes)


def gce_from_inputs(
    x: MetricInputs,
    *,
    num_bins: int,
    binning: str,
    top_label: bool,
    class_conditional: bool,
    norm: str,
    threshold: float | None,
) -> Tensor:
    """The general calibration error of validated inputs, as a 0-dim float64 tensor."""
    (stats,) = binned_stats(
        x,
        num_bins=num_bins,
        binning=binning,
        top_label=top_label,
        class_conditional=class_conditional,
        thresholds=[threshold],
    )
    return _error(stats, norm, class_conditional, x.num_classes)


def calibration_error(
    probs: Any,
    labels: Any,
    *,
    num_bins: int = 15,
    binning: str = "even",
    top_label: bool = True,
    class_conditional: bool = False,
    norm: str = "l1",
    threshold: float | None = 0.0,
    from_logits: bool = False,
) -> Tensor | float:
    """General calibration error (GCE, Nixon et al. 2019) with every knob.

    Args:
        probs: (N, K) probabilities (or logits with ``from_logits``), or (N,) / (N, 1)
            positive-class probabilities of a binary problem. numpy or torch (any device).
        labels: (N,) integer class labels in [0, K).
        num_bins: number of bins B >= 1 (even binning adds one bin for p == 1.0 exactly).
        binning: ``"even"`` (bins [k/B, (k+1)/B)) or ``"adaptive"`` (equal mass).
        top_label: only the top (max) probability of each row (True) or all K (False).
        class_conditional: bin each class separately and average over K (True) or pool (False).
        norm: ``"l1"``, ``"l2"`` (root of the weighted mean squared gap) or ``"max"`` (MCE).
        threshold: keep only probabilities > threshold (strictly); None keeps all.
        from_logits: apply softmax (sigmoid for binary shapes) first.

    Returns:
        Python float for numpy input, 0-dim tensor on the input's device for torch input.

    Raises:
        ValueError: bad shapes, labels out of range, NaN/inf, rows not summing to 1,
            num_bins < 1, or an unknown option.
    """
    num_bins = check_num_bins(num_bins)
    binning = check_choice("binning", binning, BINNINGS)
    norm = check_choice("norm", norm, NORMS)
    top_label = check_bool("top_label", top_label)
    class_conditional = check_bool("class_conditional", class_conditional)
    threshold = check_threshold(threshold)
    x = prepare(probs, labels, from_logits=from_logits)
    value = gce_from_inputs(
        x,
        num_bins=num_bins,
        binning=binning,
        top_label=top_label,
        class_conditional=class_conditional,
        norm=norm,
        threshold=threshold,
    )
    return x.finish(value)


#: The knobs of each named preset (the table in the module docstring).
PRESETS: dict[str, dict[str, Any]] = {
    "ece": {"binning": "even", "top_label": True, "class_conditional": False, "norm": "l1", "threshold": 0.0},
    "mce": {"binning": "even", "top_label": True, "class_conditional": False, "norm": "max", "threshold": 0.0},
    "rmsce": {"binning": "adaptive", "top_label": True, "class_conditional": False, "norm": "l2", "threshold": 0.0},
    "sce": {"binning": "even", "top_label": False, "class_conditional": True, "norm": "l1", "threshold": 0.0},
    "ace": {"binning": "adaptive", "top_label": False, "class_conditional": True, "norm": "l1", "threshold": 0.0},
    "tace": {"binning": "adaptive", "top_label": False, "class_conditional": True, "norm": "l1", "threshold": 0.01},
    "classwise_ece": {
        "binning": "even",
        "top_label": False,
        "class_conditional": True,
        "norm": "l1",
        "threshold": None,
    },
}


def _preset(name: str, probs: Any, labels: Any, num_bins: int, from_logits: bool, **override: Any) -> Tensor | float:
    return calibration_error(probs, labels, num_bins=num_bins, from_logits=from_logits, **{**PRESETS[name], **override})


def ece(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Expected calibration error: even bins, top label, pooled, l1."""
    return _preset("ece", probs, labels, num_bins, from_logits)


def mce(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Maximum calibration error: even bins, top label, pooled, max over non-empty bins."""
    return _preset("mce", probs, labels, num_bins, from_logits)


def rmsce(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Root-mean-square calibration error: adaptive bins, top label, pooled, l2."""
    return _preset("rmsce", probs, labels, num_bins, from_logits)


def sce(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Static calibration error: even bins, all classes, class-conditional, l1 (p > 0)."""
    return _preset("sce", probs, labels, num_bins, from_logits)


def ace(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Adaptive calibration error: adaptive bins, all classes, class-conditional, l1."""
    return _preset("ace", probs, labels, num_bins, from_logits)


def tace(
    probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False, threshold: float = 0.01
) -> Tensor | float:
    """Thresholded adaptive calibration error: ACE over probabilities > threshold (0.01)."""
    return _preset("tace", probs, labels, num_bins, from_logits, threshold=threshold)


def classwise_ece(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> Tensor | float:
    """Classwise-ECE (Kull et al. 2019): even bins, every class over all N rows, l1.

    Same as SCE except that probabilities equal to 0 are kept (threshold=None).
    """
    return _preset("classwise_ece", probs, labels, num_bins, from_logits)
