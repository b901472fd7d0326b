"""A shared backbone with one linear head per task (docs/design.md section 3, multi-task).

`MultiTaskClassifier(backbone, tasks)`: `backbone` is any registry `Classifier`; only its
`features` are used (its own head is taken over as task 0's head, so a one-task model starts
exactly like the single-task model, and replaced by an identity in the backbone). Every
further task gets its own `nn.Linear(feature_dim, K_t)`. Binary tasks have 2-logit heads, so
every metric and calibrator works unchanged.

    features(x) -> (N, feature_dim)
    forward(x)  -> [logits of task t, (N, K_t)] for t in tasks
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from calib_core.models.classifier import Classifier, check_num_classes


def _task_list(tasks: Sequence[Sequence[Any]]) -> tuple[tuple[str, int], ...]:
    out = []
    for t in tasks:
        name, k = t[0], t[1]
        out.append((str(name), check_num_classes(int(k))))
    if not out:
        raise ValueError("a multi-task model needs at least one task")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be unique, got {names}")
    return tuple(out)


class MultiTaskClassifier(nn.Module):
    """Shared feature extractor + `heads: nn.ModuleList` (one nn.Linear per task)."""

    def __init__(self, backbone: Classifier, tasks: Sequence[Sequence[Any]]) -> None:
        super().__init__()
        self.tasks = _task_list(tasks)
        self.feature_dim = int(backbone.feature_dim)
        k0 = self.tasks[0][1]
        old = getattr(backbone, "head", None)
        if isinstance(old, nn.Linear) and old.in_features == self.feature_dim and old.out_features == k0:
            first = old  # same init as the single-task model of task 0
        else:
            first = nn.Linear(self.feature_dim, k0)
        backbone.head = nn.Identity()  # type: ignore[assignment]  # the backbone's forward now returns features
        self.backbone = backbone
        self.heads = nn.ModuleList([first] + [nn.Linear(self.feature_dim, k) for _, k in self.tasks[1:]])

    @classmethod
    def create(
        cls, name: str, tasks: Sequence[Sequence[Any]], input_shape: Sequence[int], **kwargs: Any
    ) -> MultiTaskClassifier:
        """Backbone `name` from the model registry (built for the first task's classes)."""
        from calib_core.models.registry import create_model

        tasks = _task_list(tasks)
        return cls(create_model(name, tasks[0][1], tuple(input_shape), **kwargs), tasks)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def features(self, x: Tensor) -> Tensor:
        return self.backbone.features(x)

    def forward(self, x: Tensor) -> list[Tensor]:
        f = self.features(x)
        return [h(f) for h in self.heads]

    def extra_repr(self) -> str:
        return f"tasks={list(self.tasks)}, feature_dim={self.feature_dim}"


def create_multitask_model(
    name: str, tasks: Sequence[Sequence[Any]], input_shape: Sequence[int], **kwargs: Any
) -> MultiTaskClassifier:
    """`MultiTaskClassifier.create` as a function."""
    return MultiTaskClassifier.create(name, tasks, input_shape, **kwargs)


__all__ = ["MultiTaskClassifier", "create_multitask_model"]
