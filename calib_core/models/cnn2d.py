"""Small 2-D CNN for small images (digits 8x8, MNIST 28x28, CIFAR 32x32)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.registry import register_model


@register_model("cnn2d")
class CNN2D(Classifier):
    """[Conv3x3 -> BatchNorm -> ReLU -> MaxPool2 (while the map is >= 2x2)] per entry of
    `channels`, then global average pooling: feature_dim = channels[-1]."""

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        channels: Sequence[int] = (32, 64, 128),
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_classes, input_shape)
        if len(self.input_shape) != 3:
            raise ValueError(f"cnn2d needs input_shape (C, H, W), got {input_shape!r}")
        channels = tuple(channels)
        if not channels or any(not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(f"cnn2d: channels must be a non-empty tuple of positive ints, got {channels!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"cnn2d: dropout must be in [0, 1), got {dropout!r}")
        c_in, h, w = self.input_shape
        layers: list[nn.Module] = []
        for c_out in channels:
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            if min(h, w) >= 2:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            c_in = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(1)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*layers)
        self._make_head(c_in)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
