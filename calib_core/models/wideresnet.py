"""Wide ResNet (Zagoruyko & Komodakis 2016), WRN-depth-width; WRN-28-10 by default.

Pre-activation basic blocks, three groups of widths 16k, 32k, 64k with (depth - 4) / 6
blocks each. WRN-28-10 with 10 classes has 36.5M parameters; `depth=10, width=1` is a tiny
version for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.registry import register_model


class WideBasic(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.shortcut = (
            nn.Identity() if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        # the projection shortcut sees the pre-activated input, as in the reference code
        shortcut = x if isinstance(self.shortcut, nn.Identity) else self.shortcut(o)
        o = self.conv1(o)
        o = self.conv2(self.dropout(F.relu(self.bn2(o))))
        return o + shortcut


@register_model("wrn28_10")
class WideResNet(Classifier):
    """WRN-`depth`-`width`: conv3x3(16) -> 3 groups (strides 1, 2, 2) -> BN-ReLU -> avg pool."""

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        depth: int = 28,
        width: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_classes, input_shape)
        if len(self.input_shape) != 3:
            raise ValueError(f"wrn28_10 needs input_shape (C, H, W), got {input_shape!r}")
        if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ValueError(f"wrn28_10: depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth!r}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"wrn28_10: width must be a positive int, got {width!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"wrn28_10: dropout must be in [0, 1), got {dropout!r}")
        n = (depth - 4) // 6
        widths = [16, 16 * width, 32 * width, 64 * width]
        self.stem = nn.Conv2d(self.input_shape[0], widths[0], 3, padding=1, bias=False)
        groups = []
        c_in = widths[0]
        for g, stride in zip(range(3), (1, 2, 2)):
            blocks = []
            for j in range(n):
                blocks.append(WideBasic(c_in, widths[g + 1], stride if j == 0 else 1, dropout))
                c_in = widths[g + 1]
            groups.append(nn.Sequential(*blocks))
        self.groups = nn.Sequential(*groups)
        self.bn = nn.BatchNorm2d(c_in)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self._make_head(c_in)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.head.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn(self.groups(self.stem(x))))
        return self.pool(o).flatten(1)
