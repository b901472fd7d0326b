"""The model's own head as the calibrator: features -> head(features); no extra parameters.

The wrapped head is registered here so the calibrator's optimizer owns it; the backbone
(feature extractor) is everything before it.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Calibrator


class LastLayerCalibrator(Calibrator):
    name = "last_layer"
    input_kind = "features"

    def __init__(self, num_classes: int, *, head: nn.Module, feature_dim: int | None = None) -> None:
        if head is None:
            raise ValueError("last_layer calibrator needs the model's head (head=...)")
        if feature_dim is None:
            feature_dim = getattr(head, "in_features", None)
        out = getattr(head, "out_features", num_classes)
        if out != num_classes:
            raise ValueError(f"head has {out} outputs but num_classes={num_classes}")
        super().__init__(num_classes, in_dim=feature_dim)
        self.head = head
        self._check_dims = feature_dim is not None

    def forward(self, features: Tensor) -> Tensor:
        if self._check_dims:
            self._check_input(features)
        return self.head(features)

    def num_params(self) -> int:
        return 0  # the head is part of the model, not an addition

    def describe(self) -> dict:
        n_head = sum(p.numel() for p in self.head.parameters())
        return {"calibrator": self.name, "num_params": 0, "head_params": n_head}
