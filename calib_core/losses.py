"""Training losses: cross-entropy, label smoothing, focal loss (fixed gamma or FLSD-53).

FLSD-53 (Mukhoti et al. 2020): gamma = 5 when the probability of the true class is in
[0, 0.2), gamma = 3 when it is >= 0.2; gamma is chosen per sample from the (detached) current
prediction. All losses take logits (N, K) and integer labels (N,) and return the batch mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits, labels)


def label_smoothing_loss(logits: Tensor, labels: Tensor, smoothing: float = 0.1) -> Tensor:
    """(1 - eps) * NLL + eps * mean_k(-log p_k): same as F.cross_entropy(label_smoothing=eps)."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
    logp = F.log_softmax(logits, dim=1)
    nll = -logp.gather(1, labels[:, None]).squeeze(1)
    uniform = -logp.mean(dim=1)
    return ((1.0 - smoothing) * nll + smoothing * uniform).mean()


def flsd53_gamma(p_true: Tensor) -> Tensor:
    """Per-sample gamma of the FLSD-53 schedule: 5 for p_true in [0, 0.2), 3 for p_true >= 0.2."""
    return torch.where(p_true < 0.2, torch.full_like(p_true, 5.0), torch.full_like(p_true, 3.0))


def focal_loss(logits: Tensor, labels: Tensor, gamma: float | Tensor | None = None) -> Tensor:
    """Focal loss -(1 - p_t)^gamma log p_t. gamma=None uses the FLSD-53 schedule."""
    logp_t = F.log_softmax(logits, dim=1).gather(1, labels[:, None]).squeeze(1)
    p_t = logp_t.exp()
    if gamma is None:
        g = flsd53_gamma(p_t.detach())
    elif isinstance(gamma, Tensor):
        g = gamma.to(p_t)
    else:
        if gamma < 0:
            raise ValueError(f"focal gamma must be >= 0, got {gamma}")
        if gamma == 0:
            return -logp_t.mean()
        g = torch.full_like(p_t, float(gamma))
    weight = (1.0 - p_t).clamp_min(0.0).pow(g)
    return -(weight * logp_t).mean()


def make_loss(method: str, *, label_smoothing: float = 0.1, focal_gamma: float | None = None) -> LossFn:
    """The backbone's training loss for a trainer method (everything else trains with CE)."""
    if method == "label_smoothing":
        return lambda z, y: label_smoothing_loss(z, y, label_smoothing)
    if method == "focal":
        return lambda z, y: focal_loss(z, y, focal_gamma)
    return cross_entropy
