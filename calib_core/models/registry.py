"""Model registry in the style of timm's `create_model` (entries in calib_core.registry.MODELS).

`@register_model("name")` records the class itself (not a factory wrapper), so the object
`create_model("name", ...)` returns is an instance of the registered class and `isinstance`
works. Built-in names are declared in calib_core.registry; their family modules register the
declared classes when imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from calib_core.models.classifier import Classifier, check_input_shape, check_num_classes
from calib_core.registry import MODELS
from calib_core.registry import split_library_name as split_name

C = TypeVar("C", bound=type[Classifier])


def register_model(name: str) -> Callable[[C], C]:
    """Class decorator: register a `Classifier` subclass under `name` and return it unchanged."""

    def deco(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, Classifier)):
            raise TypeError(f"register_model({name!r}) expects a Classifier subclass, got {cls!r}")
        MODELS.add(name, cls)
        cls.model_name = name  # type: ignore[attr-defined]
        return cls

    return deco


def list_models() -> list[str]:
    """Registered model names, sorted."""
    return sorted(MODELS.names())


def get_model_class(name: str) -> type[Classifier]:
    """The class registered under `name`, or LibraryBackbone for torchvision/ and timm/ names (ValueError
    listing the allowed names otherwise)."""
    if split_name(name) is not None:
        from calib_core.models.library import LibraryBackbone

        return LibraryBackbone
    if name not in MODELS:
        raise ValueError(
            f"unknown model {name!r}; allowed: {', '.join(list_models())}, torchvision/<arch>, timm/<arch>"
        )
    return MODELS.get(name)  # type: ignore[no-any-return]


def create_model(name: str, num_classes: int, input_shape: tuple[int, ...] | list[int], **kwargs: Any) -> Classifier:
    """Build the model registered as `name` for `num_classes` classes and inputs of `input_shape`.

    `input_shape` excludes the batch dimension: (C, H, W) for images, (L,) for 1-D signals and
    flat vectors. Unknown names, bad `num_classes`/`input_shape` and keyword arguments the
    model does not accept raise ValueError naming the value.
    """
    num_classes = check_num_classes(num_classes)
    input_shape = check_input_shape(input_shape)
    if split_name(name) is not None:  # torchvision/<arch>, timm/<arch>: the library checks its own kwargs
        from calib_core.models.library import LibraryBackbone

        return LibraryBackbone(num_classes, input_shape, name=name, **kwargs)
    cls = get_model_class(name)
    accepted = _accepted_kwargs(cls)
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ValueError(
            f"model {name!r} got unknown keyword argument(s) {unknown}; "
            f"accepted: {', '.join(sorted(accepted)) or 'none'}"
        )
    return cls(num_classes=num_classes, input_shape=input_shape, **kwargs)


def _accepted_kwargs(cls: type) -> set[str]:
    """Names the model's constructor accepts besides num_classes and input_shape."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]  # the class's own __init__
    return {n for n, p in params.items() if p.kind in kinds and n not in ("self", "num_classes", "input_shape")}
