"""Train and eval mode of the backbone, cheaply: whether they compute the same function at all,
and a switch that flips every module's flag without `nn.Module.train`'s recursion.

The calibrator consumes the backbone's outputs in eval mode (design.md section 3). For a model
whose forward does not depend on the mode (no BatchNorm, no dropout, nothing that reads
`self.training`) the eval-mode outputs of a batch are the training forward's outputs, so
`calibrator_data: same` can reuse the backbone's own forward, and the eval/train switch
before a calibrator forward can be skipped: both give bit-identical results.
"""

from __future__ import annotations

from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.multitask import MultiTaskClassifier

# torch.nn modules whose forward never reads `self.training` (matched by exact type: a subclass
# may override forward)
_MODE_FREE_TORCH: frozenset[type] = frozenset(
    {
        nn.Sequential,
        nn.ModuleList,
        nn.ModuleDict,
        nn.Linear,
        nn.Bilinear,
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.ELU,
        nn.GELU,
        nn.SiLU,
        nn.Mish,
        nn.Tanh,
        nn.Sigmoid,
        nn.Softplus,
        nn.Flatten,
        nn.Unflatten,
        nn.Identity,
        nn.LayerNorm,
        nn.GroupNorm,
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
        nn.AdaptiveMaxPool1d,
        nn.AdaptiveMaxPool2d,
    }
)


def _trusted_shell(module: nn.Module) -> bool:
    """calib_core's own classifier classes whose forward and features only call their children
    (checked by reading them): the MLP, the CNNs and the multi-task wrapper. ResNets, WRN and
    ViT have BatchNorm, dropout or attention that reads the mode, so they never qualify anyway."""
    from calib_core.models.cnn1d import CNN1D
    from calib_core.models.cnn2d import CNN2D
    from calib_core.models.mlp import MLP

    return type(module) in (MLP, CNN1D, CNN2D, MultiTaskClassifier) and (
        not isinstance(module, Classifier) or type(module).forward is Classifier.forward
    )


def forward_is_mode_free(model: nn.Module) -> bool:
    """True when `model` computes the same function in train and eval mode: every submodule is a
    mode-free torch.nn type (exact type) or one of calib_core's classifier shells, and none has a
    forward hook (e.g. the old `spectral_norm`, whose pre-hook iterates only in train mode). Any
    other module (BatchNorm, Dropout of any rate, a custom layer) makes it False: the
    conservative answer, which only costs the extra eval-mode forward."""
    return all(
        (type(m) in _MODE_FREE_TORCH or _trusted_shell(m)) and not m._forward_pre_hooks and not m._forward_hooks
        for m in model.modules()
    )


class ModeSwitch:
    """`set(model, training)` as `model.train(training)` does it (every module's flag), by a
    flat loop over the modules listed once; models with a module that overrides `train` keep
    `model.train`. A frozen backbone's modules (calib_core/models/pretrained.py) stay in inference mode."""

    def __init__(self, model: nn.Module) -> None:
        from calib_core.models.pretrained import FROZEN_ATTR

        self.model = model
        self.modules = [m for m in model.modules() if not getattr(m, FROZEN_ATTR, False)]
        self.flat = all(type(m).train is nn.Module.train for m in self.modules)

    def set(self, training: bool) -> None:
        if not self.flat:
            self.model.train(training)
            return
        for m in self.modules:
            m.training = training
