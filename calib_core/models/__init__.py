"""Backbones behind one registry: `create_model(name, num_classes, input_shape, **kwargs)`.

Every model is a `Classifier`: `features(x) -> (N, feature_dim)`, `head` (nn.Linear), and
`forward(x) == head(features(x))`. Names match `calib_core.config.ModelName`.
"""

from calib_core.models.classifier import Classifier
from calib_core.models.registry import create_model, get_model_class, list_models, register_model

# importing the family modules registers their models
from calib_core.models import cnn1d, cnn2d, mlp, resnet, vit, wideresnet  # noqa: E402,F401  isort: skip
from calib_core.models.cnn1d import CNN1D
from calib_core.models.cnn2d import CNN2D
from calib_core.models.mlp import MLP
from calib_core.models.pretrained import build_model, freeze_backbone, load_weights
from calib_core.models.resnet import ResNet, ResNet18, ResNet34, ResNet50
from calib_core.models.vit import ViT
from calib_core.models.wideresnet import WideResNet

__all__ = [
    "Classifier",
    "create_model",
    "get_model_class",
    "list_models",
    "register_model",
    "build_model",
    "load_weights",
    "freeze_backbone",
    "MLP",
    "CNN1D",
    "CNN2D",
    "ResNet",
    "ResNet18",
    "ResNet34",
    "ResNet50",
    "WideResNet",
    "ViT",
]
