"""CIFAR-style ResNet-18/34/50 (He et al. 2016): 3x3 stem, no max-pool, four stages.

ResNet-18 with 10 classes has 11.17M parameters. `base_width` (64 by default) scales every
stage, which keeps tests fast (`base_width=4`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.registry import register_model


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(c_in, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(c_in, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x), inplace=True)


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))


class ResNet(Classifier):
    """Stem conv3x3 -> 4 stages (strides 1, 2, 2, 2) -> global average pool -> head."""

    block: type[BasicBlock] | type[Bottleneck] = BasicBlock
    num_blocks: tuple[int, int, int, int] = (2, 2, 2, 2)

    def __init__(self, num_classes: int, input_shape: tuple[int, ...], base_width: int = 64) -> None:
        super().__init__(num_classes, input_shape)
        name = getattr(self, "model_name", type(self).__name__)
        if len(self.input_shape) != 3:
            raise ValueError(f"{name} needs input_shape (C, H, W), got {input_shape!r}")
        if not isinstance(base_width, int) or base_width < 1:
            raise ValueError(f"{name}: base_width must be a positive int, got {base_width!r}")
        c = base_width
        self.stem = nn.Sequential(
            nn.Conv2d(self.input_shape[0], c, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
        )
        stages = []
        c_in = c
        for i, n in enumerate(self.num_blocks):
            planes = base_width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(self.block(c_in, planes, stride=(1 if i == 0 or j > 0 else 2)))
                c_in = planes * self.block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self._make_head(c_in)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(x))).flatten(1)


@register_model("resnet18")
class ResNet18(ResNet):
    block = BasicBlock
    num_blocks = (2, 2, 2, 2)


@register_model("resnet34")
class ResNet34(ResNet):
    block = BasicBlock
    num_blocks = (3, 4, 6, 3)


@register_model("resnet50")
class ResNet50(ResNet):
    block = Bottleneck
    num_blocks = (3, 4, 6, 3)
