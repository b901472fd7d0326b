"""Input validation and conversion shared by every metric.

Conventions (docs/interfaces.md, ``calib_core.metrics``):

* ``probs`` is (N, K) probabilities, or (N,) / (N, 1) positive-class probabilities of a
  binary problem, which become the (N, 2) matrix ``[1 - p, p]``. With ``from_logits=True``
  it holds logits: softmax over K columns, sigmoid for the binary shapes.
* ``labels`` is (N,) integers in [0, K).
* numpy (or other array-like) input -> the metric returns a Python ``float``;
  torch input -> a 0-dim tensor on the input's device. Work stays on that device.
* Internally probabilities are float64 when given as float64 and float32 otherwise
  (float16 / bfloat16 are widened to float32); bin statistics are always accumulated in
  float64. The result tensor has the working dtype.
* Rows must sum to 1 within ``ROW_SUM_ATOL + 4 K eps``, the sums accumulated in float64.
* Anything wrong raises ``ValueError`` naming the problem. Nothing is clipped.
* Large CPU matrices are validated and reduced to their top labels by one compiled pass
  (:mod:`calib_core.metrics._fast`); the result and any error are the same as here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import _backend, _fast
from ._backend import argsort_1d

BINNINGS = ("even", "adaptive")
NORMS = ("l1", "l2", "max")

#: Rows of ``probs`` must sum to 1 within ``ROW_SUM_ATOL + 4 * K * eps(dtype)``.
ROW_SUM_ATOL = 1e-4


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {name}={value!r}; allowed values: {', '.join(map(repr, allowed))}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_num_bins(num_bins: Any) -> int:
    if isinstance(num_bins, (bool, np.bool_)) or not isinstance(num_bins, (int, np.integer)):
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {int(num_bins)}")
    return int(num_bins)


def check_threshold(threshold: Any) -> float | None:
    """``None`` keeps every probability; a number t keeps only p > t (strictly)."""
    if threshold is None:
        return None
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise ValueError(f"threshold must be a number in [0, 1] or None, got {threshold!r}")
    t = float(threshold)
    if not (0.0 <= t <= 1.0):  # also rejects NaN
        raise ValueError(f"threshold must lie in [0, 1] (or be None), got {threshold!r}")
    return t


def _as_tensor(x: Any, name: str) -> tuple[Tensor, bool]:
    """Return (tensor, came_from_torch). numpy arrays are shared, not copied, when possible."""
    if isinstance(x, Tensor):
        return x.detach(), True
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}") from exc
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 2:
        arr = arr.astype(np.float32)
    if not arr.flags.c_contiguous or not arr.flags.writeable or arr.dtype.byteorder == ">":
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
    return torch.from_numpy(arr), False


@dataclass
class MetricInputs:
    """Validated inputs plus lazily computed, shared intermediate results.

    ``compute_all`` builds one of these and every metric reads from it, so the softmax,
    the top-label max/argmax and the sort of confidences are done once.
    """

    probs: Tensor  # (N, K) working dtype, rows are probability vectors
    labels: Tensor  # (N,) int64 on probs.device
    from_torch: bool
    logits: Tensor | None = None  # multiclass logits (N, K) when from_logits
    binary_logit: Tensor | None = None  # (N,) logit of the positive class when from_logits
    logsumexp: Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_classes(self) -> int:
        return self.probs.shape[1]

    @property
    def n(self) -> int:
        return self.probs.shape[0]

    @property
    def device(self) -> torch.device:
        return self.probs.device

    @property
    def dtype(self) -> torch.dtype:
        return self.probs.dtype

    # -- shared intermediates -------------------------------------------------------
    def top(self) -> tuple[Tensor, Tensor]:
        """(confidence, predicted class): max and first argmax of each row."""
        if "top" not in self._cache:
            self._cache["top"] = _backend.top_label(self.probs)
        return self._cache["top"]

    def correct(self) -> Tensor:
        if "correct" not in self._cache:
            self._cache["correct"] = _backend.equal(self.top()[1], self.labels)
        return self._cache["correct"]

    def p_true(self) -> Tensor:
        """Probability given to the true class, (N,)."""
        if "p_true" not in self._cache:
            self._cache["p_true"] = self.probs.gather(1, self.labels.unsqueeze(1)).squeeze(1)
        return self._cache["p_true"]

    def sorted_conf(self) -> tuple[Tensor, Tensor]:
        """Confidences sorted ascending, and the permutation that sorts them."""
        if "sorted_conf" not in self._cache:
            conf = self.top()[0]
            order = argsort_1d(conf)
            self._cache["sorted_conf"] = (conf[order], order)
        return self._cache["sorted_conf"]

    def nll_per_row(self) -> Tensor:
        """-log p(true class) per row in float64; from logits when available (stable)."""
        if "nll" not in self._cache:
            y = self.labels
            if self.binary_logit is not None:
                z = self.binary_logit.double()
                nll = torch.nn.functional.softplus(z * (1.0 - 2.0 * y.double()))
            elif self.logits is not None:
                assert self.logsumexp is not None  # prepare() sets logits and logsumexp together
                z_true = self.logits.gather(1, y.unsqueeze(1)).squeeze(1)
                nll = self.logsumexp.double() - z_true.double()
            else:
                nll = _backend.neg_log(self.p_true())
            self._cache["nll"] = nll
        return self._cache["nll"]

    def finish(self, value: Tensor) -> Tensor | float:
        """0-dim result in the caller's type: tensor on the input device, or float."""
        if self.from_torch:
            return value.to(dtype=self.dtype).reshape(())
        return float(value)


def prepare(probs: Any, labels: Any, *, from_logits: bool = False) -> MetricInputs:
    """Validate and convert (probs, labels) as the module docstring describes."""
    from_logits = check_bool("from_logits", from_logits)
    p, p_torch = _as_tensor(probs, "probs")
    y, _ = _as_tensor(labels, "labels")

    if not p.is_floating_point():
        what = "logits" if from_logits else "probabilities"
        raise ValueError(f"probs must hold floating-point {what}, got dtype {p.dtype}")
    if p.dtype not in (torch.float32, torch.float64):
        p = p.float()
    if p.ndim not in (1, 2):
        raise ValueError(f"probs must have shape (N, K), (N,) or (N, 1); got shape {tuple(p.shape)}")
    binary = p.ndim == 1 or p.shape[1] == 1
    num_classes = 2 if binary else p.shape[1]
    n = p.shape[0]
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(
            f"shape mismatch: probs has shape {tuple(p.shape)}, so labels must have shape ({n},); "
            f"got labels of shape {tuple(y.shape)}"
        )
    if n == 0:
        raise ValueError("probs and labels are empty (N = 0): nothing to measure")

    # labels: integers in [0, K)
    if y.dtype == torch.bool:
        y = y.long()
    if y.is_floating_point() or y.is_complex():
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    y = y.to(device=p.device, dtype=torch.int64)
    lo, hi = _backend.int_range(y)
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"labels out of range: expected integers in [0, {num_classes - 1}] (K = {num_classes} classes), found {bad}"
        )

    tol = ROW_SUM_ATOL + 4 * num_classes * torch.finfo(p.dtype).eps  # for rows of probabilities
    if not from_logits and not binary and _fast.usable(p):
        # one compiled pass validates and finds the top labels; anything odd falls through
        # to the checks below, which name the problem
        scan = _fast.scan_rows(p, tol)
        if scan.valid:
            out = MetricInputs(probs=p, labels=y, from_torch=p_torch)
            out._cache["top"] = (scan.conf, scan.pred)
            return out

    # values: finite; probabilities in [0, 1] with rows summing to 1
    mn_t, mx_t = torch.aminmax(p)
    mn, mx = float(mn_t), float(mx_t)
    ok = math.isfinite(mn) and math.isfinite(mx) and (from_logits or (mn >= 0.0 and mx <= 1.0))
    if not ok:
        _raise_bad_values(p, from_logits, mn, mx)

    out = MetricInputs(probs=p, labels=y, from_torch=p_torch)
    if binary:
        z = p.reshape(n)
        if from_logits:
            out.binary_logit = z
            z = torch.sigmoid(z)
        out.probs = torch.stack((1.0 - z, z), dim=1)
    elif from_logits:
        lse = torch.logsumexp(p, dim=1)
        out.logits, out.logsumexp = p, lse
        out.probs = torch.exp(p - lse.unsqueeze(1))
    else:
        sums = p.sum(dim=1, dtype=torch.float64)  # float64 accumulation, as the compiled scan does
        lo_sum, hi_sum = (float(v) for v in torch.aminmax(sums))
        if not (abs(lo_sum - 1.0) <= tol and abs(hi_sum - 1.0) <= tol):
            worst = int(torch.argmax((sums - 1.0).abs()))
            raise ValueError(
                f"rows of probs must sum to 1 (tolerance {tol:.3g}); row {worst} sums to "
                f"{float(sums[worst]):.8g}. Pass from_logits=True if these are logits."
            )
    return out


def _raise_bad_values(p: Tensor, from_logits: bool, mn: float, mx: float) -> None:
    what = "logits" if from_logits else "probs"
    nan = torch.isnan(p)
    if bool(nan.any()):
        first = tuple(int(i) for i in nan.nonzero()[0])
        raise ValueError(f"{what} contains NaN ({int(nan.sum())} values; first at index {first})")
    inf = torch.isinf(p)
    if bool(inf.any()):
        first = tuple(int(i) for i in inf.nonzero()[0])
        raise ValueError(f"{what} contains inf ({int(inf.sum())} values; first at index {first})")
    raise ValueError(
        f"probabilities must lie in [0, 1]; found min {mn:.8g} and max {mx:.8g}. "
        "Pass from_logits=True if these are logits."
    )
