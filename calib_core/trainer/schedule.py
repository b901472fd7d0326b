"""Optimizers and learning-rate schedules for the two players (backbone and calibrator)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from calib_core.config import TrainConfig


def backbone_param_groups(
    feature_params: list[nn.Parameter], head: nn.Module, warmup_head_params: list[nn.Parameter], cfg: TrainConfig
) -> list[dict]:
    """The backbone optimizer's parameter groups.

    ``feature_params`` are what the backbone player trains (the model's own head included
    unless the head is the calibrator); ``warmup_head_params`` join only for a last-layer
    warm-up. With ``cfg.head_lr`` the parameters of ``head`` found among them form their own
    group at that learning rate (the schedule scales both groups alike).
    """
    if cfg.head_lr is None:
        return [{"params": feature_params}] + ([{"params": warmup_head_params}] if warmup_head_params else [])
    trained = feature_params + warmup_head_params
    head_ids = {id(p) for p in head.parameters()}
    rest = [p for p in trained if id(p) not in head_ids]
    heads = [p for p in trained if id(p) in head_ids]
    return [{"params": rest}] + ([{"params": heads, "lr": cfg.head_lr}] if heads else [])


def backbone_optimizer(param_groups: list[dict], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The backbone's optimizer (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(param_groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(param_groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(param_groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def calibrator_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The calibrator's optimizer (cfg.calibrator_optimizer, cfg.calibrator_lr; no weight decay)."""
    params = list(params)
    if cfg.calibrator_optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.calibrator_lr, momentum=cfg.momentum)
    if cfg.calibrator_optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.calibrator_lr)
    raise ValueError(f"unknown calibrator optimizer {cfg.calibrator_optimizer!r}")


def lr_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule of the backbone: cosine to 0 over cfg.epochs, step (x0.1 at 50% and
    75% of the epochs), or none (constant)."""
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    if cfg.lr_schedule == "step":
        milestones = sorted({max(1, cfg.epochs // 2), max(1, (3 * cfg.epochs) // 4)})
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=_constant)


def _constant(epoch: int) -> float:  # module-level so the scheduler's state stays picklable
    return 1.0
