"""Streaming, mergeable calibration statistics with state O(bins x K), independent of N.

Only **even** binning is streamed. Even bins are fixed in advance ([k/B, (k+1)/B) plus the
bin for p == 1.0), so per-bin counts, sums of confidences and sums of correctness are
sufficient statistics that can be added up batch by batch and merged across workers, and
the result equals the one-shot computation on the concatenated data (up to float64
summation order). **Adaptive** binning (ACE, TACE, RMSCE) places its edges at quantiles of
the *whole* set of values, so it needs every value, not a fixed-size summary; it is
therefore not streamed: keep the probabilities and call the one-shot functions (exact),
or use the even-binned metrics here.

State (all float64, on the device of the first batch unless ``device`` is given):

* top label, grouped by predicted class: counts, confidence sums, correct counts,
  shape (K, B + 2) (pooled top-label = sum over classes);
* all classes, class-conditional: counts, probability sums, correct counts, (K, B + 2);
* the extra sub-bin separates probabilities equal to 0, so both SCE (p > 0) and
  classwise-ECE (all p) come from the same state;
* scalars: N, correct count, sum of NLL, sum of Brier.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._inputs import NORMS, check_bool, check_choice, check_num_bins, check_threshold, prepare
from .binning import EvenBinner, combine, even_sub_stats_1d, even_sub_stats_2d, group_errors
from .scores import brier_per_row

__all__ = ["CalibrationAccumulator"]

_MATRICES = ("top_counts", "top_conf", "top_correct", "cls_counts", "cls_sums", "cls_correct")
_SCALARS = ("n", "n_correct", "nll_sum", "brier_sum")


class CalibrationAccumulator:
    """Accumulate even-binned calibration statistics over batches.

    >>> acc = CalibrationAccumulator(num_classes=10, num_bins=15)
    >>> for logits, y in loader:                      # doctest: +SKIP
    ...     acc.update(logits, y)                     # with from_logits=True
    >>> acc.compute()                                 # doctest: +SKIP
    {'accuracy': ..., 'nll': ..., 'brier': ..., 'ece': ..., 'mce': ..., 'sce': ..., 'classwise_ece': ...}

    ``update`` takes the same inputs as the one-shot metrics (numpy or torch, any device,
    (N, K) or binary (N,) / (N, 1)); ``merge`` adds another accumulator's state (e.g. from
    another worker or data shard); ``reset`` clears it. ``state_dict`` / ``load_state_dict``
    round-trip the state for checkpoints.
    """

    _THRESHOLDS = (0.0,)

    # State tensors (float64), set by reset() / load_state_dict() / _move_to() through the
    # names in _MATRICES and _SCALARS.
    top_counts: Tensor
    top_conf: Tensor
    top_correct: Tensor
    cls_counts: Tensor
    cls_sums: Tensor
    cls_correct: Tensor
    n: Tensor
    n_correct: Tensor
    nll_sum: Tensor
    brier_sum: Tensor

    def __init__(
        self,
        num_classes: int,
        num_bins: int = 15,
        *,
        from_logits: bool = False,
        device: str | torch.device | None = None,
    ):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2 (use 2 for binary), got {num_classes!r}")
        self.num_classes = num_classes
        self.num_bins = check_num_bins(num_bins)
        self.from_logits = check_bool("from_logits", from_logits)
        self.device = torch.device(device) if device is not None else None
        self._binners: dict = {}
        self.reset()

    # -- state ------------------------------------------------------------------------
    @property
    def num_sub(self) -> int:
        return self.num_bins + 2  # B even bins + the p == 1.0 bin + the p == 0 sub-bin

    def reset(self) -> CalibrationAccumulator:
        dev = self.device or torch.device("cpu")
        for name in _MATRICES:
            setattr(self, name, torch.zeros(self.num_classes, self.num_sub, dtype=torch.float64, device=dev))
        for name in _SCALARS:
            setattr(self, name, torch.zeros((), dtype=torch.float64, device=dev))
        self._started = self.device is not None
        return self

    @property
    def state_nbytes(self) -> int:
        """Bytes held by the state tensors: 6 * K * (B + 2) * 8 + 32, whatever N is."""
        return sum(getattr(self, n).element_size() * getattr(self, n).numel() for n in _MATRICES + _SCALARS)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_classes": self.num_classes, "num_bins": self.num_bins}
        out.update({n: getattr(self, n).detach().cpu().clone() for n in _MATRICES + _SCALARS})
        return out

    def load_state_dict(self, state: dict[str, Any]) -> CalibrationAccumulator:
        if state.get("num_classes") != self.num_classes or state.get("num_bins") != self.num_bins:
            raise ValueError(
                f"state is for num_classes={state.get('num_classes')}, num_bins={state.get('num_bins')}; "
                f"this accumulator has num_classes={self.num_classes}, num_bins={self.num_bins}"
            )
        dev = self.device or torch.device("cpu")
        for n in _MATRICES + _SCALARS:
            setattr(self, n, state[n].to(device=dev, dtype=torch.float64).clone())
        return self

    def _binner(self, dtype: torch.dtype, device: torch.device) -> EvenBinner:
        key = (dtype, device)
        if key not in self._binners:
            binner = EvenBinner(self.num_bins, self._THRESHOLDS, dtype, device)
            assert binner.num_sub == self.num_sub
            self._binners[key] = binner
        return self._binners[key]

    def _move_to(self, device: torch.device) -> None:
        for n in _MATRICES + _SCALARS:
            setattr(self, n, getattr(self, n).to(device))
        self.device = device

    # -- update / merge ---------------------------------------------------------------
    def update(self, probs: Any, labels: Any) -> CalibrationAccumulator:
        x = prepare(probs, labels, from_logits=self.from_logits)
        if x.num_classes != self.num_classes:
            raise ValueError(
                f"this accumulator has num_classes={self.num_classes}, but probs has shape "
                f"{tuple(x.probs.shape)} ({x.num_classes} classes)"
            )
        if not self._started:
            self._move_to(x.device)
            self._started = True
        k = self.num_classes
        binner = self._binner(x.dtype, x.device)
        conf, pred = x.top()
        correct = x.correct()
        cnt, conf_sums, corr = even_sub_stats_1d(binner, conf, pred, k, weights=correct)
        assert corr is not None  # weight sums come back when weights are given
        cls_cnt, cls_sums = even_sub_stats_2d(binner, x.probs, columns=True)
        cls_corr, _, _ = even_sub_stats_1d(binner, x.p_true(), x.labels, k)
        dev = self.device
        self.top_counts += cnt.to(dev)
        self.top_conf += conf_sums.to(dev)
        self.top_correct += corr.to(dev)
        self.cls_counts += cls_cnt.to(dev)
        self.cls_sums += cls_sums.to(dev)
        self.cls_correct += cls_corr.to(dev)
        self.n += float(x.n)
        self.n_correct += correct.sum().to(device=dev, dtype=torch.float64)
        self.nll_sum += x.nll_per_row().sum().to(dev)
        self.brier_sum += brier_per_row(x).sum().to(dev)
        return self

    def merge(self, other: CalibrationAccumulator) -> CalibrationAccumulator:
        """Add ``other``'s statistics into this accumulator (in place); returns self."""
        if not isinstance(other, CalibrationAccumulator):
            raise ValueError(f"can only merge a CalibrationAccumulator, got {type(other).__name__}")
        if (other.num_classes, other.num_bins) != (self.num_classes, self.num_bins):
            raise ValueError(
                f"cannot merge accumulators with different settings: num_classes/num_bins "
                f"{other.num_classes}/{other.num_bins} vs {self.num_classes}/{self.num_bins}"
            )
        if not self._started and other._started:
            assert other.device is not None  # a started accumulator has a device
            self._move_to(other.device)
            self._started = True
        for n in _MATRICES + _SCALARS:
            getattr(self, n).add_(getattr(other, n).to(getattr(self, n).device))
        return self

    # -- results ----------------------------------------------------------------------
    def _check_nonempty(self) -> None:
        if float(self.n) == 0:
            raise ValueError("CalibrationAccumulator is empty: call update() before compute()")

    def calibration_error(
        self,
        *,
        top_label: bool = True,
        class_conditional: bool = False,
        norm: str = "l1",
        threshold: float | None = 0.0,
    ) -> float:
        """Even-binned GCE from the state; ``threshold`` must be 0.0 or None here."""
        self._check_nonempty()
        top_label = check_bool("top_label", top_label)
        class_conditional = check_bool("class_conditional", class_conditional)
        norm = check_choice("norm", norm, NORMS)
        threshold = check_threshold(threshold)
        if threshold not in (0.0, None):
            raise ValueError(
                f"the streaming accumulator supports threshold 0.0 or None, got {threshold!r}; "
                "use the one-shot calibration_error for other thresholds"
            )
        binner = self._binner(torch.float64, torch.device("cpu"))
        ti = 0 if threshold == 0.0 else None
        names = ("top_counts", "top_conf", "top_correct") if top_label else ("cls_counts", "cls_sums", "cls_correct")

        def collapsed(name: str) -> Tensor:
            sub = getattr(self, name).cpu()
            if not class_conditional:
                sub = sub.sum(dim=0, keepdim=True)
            return binner.collapse(sub, ti)

        counts, sums, correct = (collapsed(name) for name in names)
        value = combine(group_errors(counts, sums, correct, norm), norm, class_conditional, self.num_classes)
        return float(value)

    def compute(self) -> dict[str, float]:
        """accuracy, nll, brier, ece, mce, sce, classwise_ece (and n) as Python floats."""
        self._check_nonempty()
        n = float(self.n)
        return {
            "accuracy": float(self.n_correct) / n,
            "nll": float(self.nll_sum) / n,
            "brier": float(self.brier_sum) / n,
            "ece": self.calibration_error(norm="l1"),
            "mce": self.calibration_error(norm="max"),
            "sce": self.calibration_error(top_label=False, class_conditional=True),
            "classwise_ece": self.calibration_error(top_label=False, class_conditional=True, threshold=None),
            "n": n,
        }

    def __repr__(self) -> str:
        return (
            f"CalibrationAccumulator(num_classes={self.num_classes}, num_bins={self.num_bins}, "
            f"from_logits={self.from_logits}, n={int(float(self.n))})"
        )
