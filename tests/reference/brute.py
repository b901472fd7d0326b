"""A deliberately plain, loop-based general calibration error, written from docs/design.md section 4.

It shares no code with ``calib_core.metrics``. It exists to check the knobs the PyPI
reference cannot (norm="l2" after the reference's L2 fix, norm="max") and as a second
opinion elsewhere. Slow: use on small inputs only.
"""

from __future__ import annotations

import numpy as np


def _group_error(values, hits, *, num_bins, binning, norm, threshold):
    values = np.asarray(values, dtype=np.float64)
    hits = np.asarray(hits, dtype=np.float64)
    if threshold is not None:
        keep = values > threshold
        values, hits = values[keep], hits[keep]
    n = len(values)
    if n == 0:
        return 0.0
    if binning == "even":
        upper = np.linspace(0.0, 1.0, num_bins + 1)[1:]  # includes 1.0: p == 1.0 gets its own bin
    else:
        s = np.sort(values)
        idx = [min(int(round(i * (n / num_bins))), n - 1) for i in range(num_bins)]
        upper = s[idx][1:]
    which = np.searchsorted(upper, values, side="right")  # number of upper edges <= value
    total = 0.0
    worst = 0.0
    for b in sorted(set(which.tolist())):
        members = which == b
        nb = int(members.sum())
        gap = hits[members].mean() - values[members].mean()
        if norm == "l1":
            total += nb / n * abs(gap)
        elif norm == "l2":
            total += nb / n * gap * gap
        else:
            worst = max(worst, abs(gap))
    return worst if norm == "max" else total


def brute_gce(
    probs, labels, *, num_bins=15, binning="even", top_label=True, class_conditional=False, norm="l1", threshold=0.0
):
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    if probs.ndim == 1 or probs.shape[1] == 1:
        p = probs.reshape(-1)
        probs = np.stack([1.0 - p, p], axis=1)
    n, k = probs.shape
    onehot = np.zeros((n, k))
    onehot[np.arange(n), labels] = 1.0
    kw = dict(num_bins=num_bins, binning=binning, norm=norm, threshold=threshold)
    if top_label:
        pred = np.argmax(probs, axis=1)
        conf = probs[np.arange(n), pred]
        hit = (pred == labels).astype(float)
        if class_conditional:
            value = sum(_group_error(conf[pred == c], hit[pred == c], **kw) for c in range(k)) / k
        else:
            value = _group_error(conf, hit, **kw)
    elif class_conditional:
        value = sum(_group_error(probs[:, c], onehot[:, c], **kw) for c in range(k)) / k
    else:
        value = _group_error(probs.ravel(), onehot.ravel(), **kw)
    return float(np.sqrt(value)) if norm == "l2" else float(value)
