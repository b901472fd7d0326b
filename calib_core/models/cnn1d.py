"""1-D CNN for signals such as MNIST-1D: inputs (N, L) or (N, C, L)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.registry import register_model


@register_model("cnn1d")
class CNN1D(Classifier):
    """[Conv1d(stride 2) -> BatchNorm -> ReLU] per entry of `channels`, then flatten.

    `input_shape` is (L,) (one channel; batches may be (N, L) or (N, 1, L)) or (C, L).
    The features keep position (flattened, as in the MNIST-1D reference CNN), so
    feature_dim = channels[-1] * L_out. Defaults: L=40 -> 20 -> 10 -> 5, 320 features.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        channels: Sequence[int] = (32, 64, 64),
        kernel_sizes: Sequence[int] = (5, 3, 3),
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_classes, input_shape)
        if len(self.input_shape) not in (1, 2):
            raise ValueError(f"cnn1d needs input_shape (L,) or (C, L), got {input_shape!r}")
        channels, kernel_sizes = tuple(channels), tuple(kernel_sizes)
        if not channels or len(channels) != len(kernel_sizes):
            raise ValueError(
                f"cnn1d: channels {channels!r} and kernel_sizes {kernel_sizes!r} must be non-empty and of equal length"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"cnn1d: dropout must be in [0, 1), got {dropout!r}")
        self.in_channels = 1 if len(self.input_shape) == 1 else self.input_shape[0]
        length = self.input_shape[-1]
        layers: list[nn.Module] = []
        c_in = self.in_channels
        for c_out, k in zip(channels, kernel_sizes):
            pad = k // 2
            layers += [
                nn.Conv1d(c_in, c_out, k, stride=2, padding=pad, bias=False),
                nn.BatchNorm1d(c_out),
                nn.ReLU(inplace=True),
            ]
            length = (length + 2 * pad - k) // 2 + 1  # >= 1 for any length >= 1
            c_in = c_out
        layers.append(nn.Flatten(1))
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*layers)
        self._make_head(c_in * length)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        return self.body(x)
