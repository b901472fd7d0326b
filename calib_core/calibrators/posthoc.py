"""Post-hoc fitting (Guo et al. 2017): full-batch LBFGS with strong-Wolfe line search on cached
calibrator inputs (logits, or features for `last_layer`) of a held-out split.

Fitting runs in float64 by default; the parameters are cast back to their dtype afterwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Calibrator


def _check(inputs: Tensor, labels: Tensor, calibrator: Calibrator) -> None:
    if inputs.dim() != 2:
        raise ValueError(f"fit_posthoc: inputs must be (N, D), got shape {tuple(inputs.shape)}")
    if labels.dim() != 1 or labels.shape[0] != inputs.shape[0]:
        raise ValueError(f"fit_posthoc: labels must be (N,) with N={inputs.shape[0]}, got shape {tuple(labels.shape)}")
    if inputs.shape[0] == 0:
        raise ValueError("fit_posthoc: no samples")
    if not torch.isfinite(inputs).all():
        raise ValueError("fit_posthoc: inputs contain NaN or inf")
    if labels.dtype.is_floating_point or labels.min() < 0 or labels.max() >= calibrator.num_classes:
        raise ValueError(f"fit_posthoc: labels must be integers in [0, {calibrator.num_classes})")


def fit_posthoc(
    calibrator: Calibrator,
    logits: Tensor,
    labels: Tensor,
    max_iter: int = 200,
    *,
    lr: float = 1.0,
    tolerance_grad: float = 1e-9,
    tolerance_change: float = 1e-12,
    dtype: torch.dtype | None = torch.float64,
) -> dict:
    """Fit `calibrator` in place by minimising CE (+ its regularisation) on (logits, labels).

    Returns {"nll_before", "nll_after", "iterations"} (NLL without the regularisation term).
    """
    _check(logits, labels, calibrator)
    params = [p for p in calibrator.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"fit_posthoc: calibrator {calibrator.name!r} has no trainable parameters")
    orig_dtype = params[0].dtype
    if getattr(calibrator, "_head", None) is not None:  # mlp on features: head is not ours to cast
        dtype = None
    if dtype is not None:
        calibrator.to(dtype)
    x = logits.detach().to(device=params[0].device, dtype=dtype or logits.dtype)
    y = labels.detach().to(device=params[0].device, dtype=torch.long)
    was_training = calibrator.training
    calibrator.train()
    params = [p for p in calibrator.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(
        params,
        lr=lr,
        max_iter=max_iter,
        line_search_fn="strong_wolfe",
        tolerance_grad=tolerance_grad,
        tolerance_change=tolerance_change,
        history_size=20,
    )
    with torch.no_grad():
        nll_before = float(F.cross_entropy(calibrator(x), y))

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(calibrator(x), y) + calibrator.regularization()
        loss.backward()
        return loss

    snapshot = {k: v.detach().clone() for k, v in calibrator.state_dict().items()}
    opt.step(closure)
    with torch.no_grad():
        ok = all(torch.isfinite(p).all() for p in params)
        nll_after = float(F.cross_entropy(calibrator(x), y)) if ok else float("nan")
    if not ok or nll_after != nll_after:  # numerical failure: keep the starting point
        calibrator.load_state_dict(snapshot)
        nll_after = nll_before
    n_iter = int(opt.state[params[0]].get("n_iter", 0))
    if dtype is not None:
        calibrator.to(orig_dtype)
    for p in calibrator.parameters():
        p.grad = None
    calibrator.train(was_training)
    return {"nll_before": nll_before, "nll_after": nll_after, "iterations": n_iter}
