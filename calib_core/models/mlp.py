"""Multi-layer perceptron: flattens any input shape."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from calib_core.models.classifier import Classifier, flat_size
from calib_core.models.registry import register_model


@register_model("mlp")
class MLP(Classifier):
    """Flatten -> [Linear -> ReLU -> Dropout] x len(hidden_dims) -> head.

    With `hidden_dims=()` the features are the flattened input (multinomial logistic regression).
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        hidden_dims: Sequence[int] = (256, 256),
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_classes, input_shape)
        hidden_dims = tuple(hidden_dims)
        if any(not isinstance(h, int) or h < 1 for h in hidden_dims):
            raise ValueError(f"mlp: hidden_dims must be positive ints, got {hidden_dims!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"mlp: dropout must be in [0, 1), got {dropout!r}")
        layers: list[nn.Module] = [nn.Flatten(1)]
        width = flat_size(self.input_shape)
        for h in hidden_dims:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        self.body = nn.Sequential(*layers)
        self._make_head(width)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
