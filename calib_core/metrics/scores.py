"""Non-binned scores (accuracy, NLL, Brier, AURC) and ``compute_all``.

``compute_all`` is what the trainer calls every epoch: it validates once, applies the softmax
once, and shares the top-label max/argmax, the sort of the confidences (RMSCE, AURC), one
bucketize pass over all probabilities (SCE and classwise-ECE) and one column sort
(ACE and TACE) between the metrics.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._backend import row_norms
from ._inputs import MetricInputs, check_num_bins, prepare
from .calibration_error import _error, binned_stats

__all__ = ["accuracy", "nll", "brier", "aurc", "compute_all", "METRIC_NAMES"]

#: Keys of :func:`compute_all`, in order.
METRIC_NAMES = ("accuracy", "nll", "brier", "ece", "mce", "rmsce", "sce", "ace", "tace", "classwise_ece", "aurc")


def _accuracy(x: MetricInputs) -> Tensor:
    return x.correct().to(torch.float64).mean()


def _nll(x: MetricInputs) -> Tensor:
    return x.nll_per_row().mean()


def brier_per_row(x: MetricInputs) -> Tensor:
    """sum_k (p_k - onehot_k)^2 per row, float64; written as
    sum_k p_k^2 - p_y^2 + (1 - p_y)^2 to avoid an (N, K) one-hot temporary."""
    p_true = x.p_true().to(torch.float64)
    sq = row_norms(x.probs).to(torch.float64).square()
    return sq - p_true.square() + (1.0 - p_true).square()


def _brier(x: MetricInputs) -> Tensor:
    return brier_per_row(x).mean()


def _aurc(x: MetricInputs) -> Tensor:
    """Area under the risk-coverage curve, confidence = max probability.

    Rows are accepted in decreasing confidence; at each of the N coverage levels i/N the risk
    is the error rate of the accepted rows, AURC = mean of the N risks. Tied confidences are
    accepted together (a threshold cannot split them): every row of a tie block gets the
    risk of the whole block, so the value does not depend on the order of ties.
    """
    conf_sorted, order = x.sorted_conf()  # ascending
    errors = (~x.correct())[order].to(torch.float64)
    cum = torch.nn.functional.pad(torch.cumsum(errors, 0), (1, 0))
    first = torch.searchsorted(conf_sorted, conf_sorted, right=False)  # start of each tie block
    accepted = (x.n - first).to(torch.float64)
    return ((cum[-1] - cum[first]) / accepted).mean()


def accuracy(probs: Any, labels: Any, *, from_logits: bool = False) -> Tensor | float:
    """Fraction of rows whose (first) argmax equals the label."""
    x = prepare(probs, labels, from_logits=from_logits)
    return x.finish(_accuracy(x))


def nll(probs: Any, labels: Any, *, from_logits: bool = False) -> Tensor | float:
    """Mean negative log-likelihood of the true class (natural log).

    With ``from_logits=True`` it is computed from log-softmax (log-sigmoid), stable and
    finite; from probabilities it is -log p, which is inf if a true class has p == 0.
    """
    x = prepare(probs, labels, from_logits=from_logits)
    return x.finish(_nll(x))


def brier(probs: Any, labels: Any, *, from_logits: bool = False) -> Tensor | float:
    """Multiclass Brier score: mean over rows of sum_k (p_k - onehot_k)^2 (in [0, 2]).

    A binary (N,) input is first made (N, 2), so its value is twice the usual binary
    Brier score (p - y)^2.
    """
    x = prepare(probs, labels, from_logits=from_logits)
    return x.finish(_brier(x))


def aurc(probs: Any, labels: Any, *, from_logits: bool = False) -> Tensor | float:
    """Area under the risk-coverage curve of selective prediction by confidence (lower is better)."""
    x = prepare(probs, labels, from_logits=from_logits)
    return x.finish(_aurc(x))


def metrics_from_inputs(x: MetricInputs, num_bins: int) -> dict[str, Tensor]:
    """Every metric of :data:`METRIC_NAMES` as 0-dim float64 tensors, sharing work."""
    k = x.num_classes
    b = num_bins
    (top_even,) = binned_stats(x, num_bins=b, binning="even", top_label=True, class_conditional=False, thresholds=[0.0])
    (top_adaptive,) = binned_stats(
        x, num_bins=b, binning="adaptive", top_label=True, class_conditional=False, thresholds=[0.0]
    )
    sce_stats, cw_stats = binned_stats(
        x, num_bins=b, binning="even", top_label=False, class_conditional=True, thresholds=[0.0, None]
    )
    ace_stats, tace_stats = binned_stats(
        x, num_bins=b, binning="adaptive", top_label=False, class_conditional=True, thresholds=[0.0, 0.01]
    )
    return {
        "accuracy": _accuracy(x),
        "nll": _nll(x),
        "brier": _brier(x),
        "ece": _error(top_even, "l1", False, k),
        "mce": _error(top_even, "max", False, k),
        "rmsce": _error(top_adaptive, "l2", False, k),
        "sce": _error(sce_stats, "l1", True, k),
        "ace": _error(ace_stats, "l1", True, k),
        "tace": _error(tace_stats, "l1", True, k),
        "classwise_ece": _error(cw_stats, "l1", True, k),
        "aurc": _aurc(x),
    }


def compute_all(probs: Any, labels: Any, *, num_bins: int = 15, from_logits: bool = False) -> dict[str, float]:
    """All metrics at once as Python floats: accuracy, nll, brier, ece, mce, rmsce, sce, ace,
    tace, classwise_ece, aurc (each as its own function computes it)."""
    num_bins = check_num_bins(num_bins)
    x = prepare(probs, labels, from_logits=from_logits)
    values = metrics_from_inputs(x, num_bins)
    flat = torch.stack([values[name] for name in METRIC_NAMES]).tolist()  # one device sync
    return dict(zip(METRIC_NAMES, (float(v) for v in flat), strict=True))
