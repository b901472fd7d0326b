"""`Classifier`: the base every backbone in the registry derives from.

A classifier is a feature extractor followed by one linear head:
`forward(x) == head(features(x))`. The split matters to calibration: the `last_layer` and
`mlp` calibrators consume `features(x)` (shape (N, feature_dim)), and the `last_layer`
calibrator *is* `head` (an `nn.Linear(feature_dim, num_classes)`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def check_num_classes(num_classes: object) -> int:
    """Return `num_classes` as an int, or raise ValueError naming the bad value."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    return int(num_classes)


def check_input_shape(
    input_shape: object, *, ndims: tuple[int, ...] | None = None, model: str = "model"
) -> tuple[int, ...]:
    """Return `input_shape` as a tuple of positive ints (length in `ndims` when given), else ValueError."""
    try:
        shape: tuple[Any, ...] = tuple(input_shape)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"input_shape must be a tuple of positive ints, got {input_shape!r}") from None
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    if ndims is not None and len(shape) not in ndims:
        want = " or ".join({1: "(L,)", 2: "(C, L)", 3: "(C, H, W)"}.get(n, f"{n}-d") for n in ndims)
        raise ValueError(f"{model} needs input_shape {want}, got {input_shape!r}")
    return tuple(int(s) for s in shape)


class Classifier(nn.Module):
    """Base class: subclasses build their body, implement `features`, then call `_make_head`.

    Attributes: `num_classes`, `input_shape`, `feature_dim`, `head` (nn.Linear feature_dim -> K).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        self.input_shape = check_input_shape(input_shape)
        self.feature_dim = 0
        self.head: nn.Linear

    def _make_head(self, feature_dim: int) -> None:
        self.feature_dim = int(feature_dim)
        self.head = nn.Linear(self.feature_dim, self.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of inputs to penultimate features of shape (N, feature_dim)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (N, num_classes): `head(features(x))`."""
        return self.head(self.features(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, input_shape={self.input_shape}, feature_dim={self.feature_dim}"


def flat_size(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))
