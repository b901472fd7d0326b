"""What configs name, in one registry type: models, datasets and calibrators, each name with its metadata.

Built-ins are declared here by "module:attribute", so their names and metadata are known without importing
their modules (and torch): a config of built-ins validates in milliseconds, `sweeps.config`'s default
calibrators, the preflight's datasets that need a data root and the model/data shape check all read these
tables. The object is imported on first use (`get`). Plugins (calib_core.plugins, docs/extending.md) add
entries with the family decorators (`register_model`, `register_dataset`, `register_calibrator`), which
call `Registry.add`; a built-in's own module registering the declared object is accepted, any other
object under a taken name is refused.

Metadata (a fixed set of keys per registry, with defaults):
- datasets: `generated` (honours data.num_samples), `augmentable` (applies data.augment), `needs_root`
  (reads files under data.root), `shape` ((input shape without the batch dimension, classes of the first
  task) when the config does not change it, else None);
- models and calibrators: none yet.

This module imports nothing of the project.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry:
    target: Any  # the object, or "module:attribute" until first use
    meta: dict[str, Any]
    builtin: bool


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


class Registry(Generic[T]):
    """Names -> objects (built-ins imported on first use) with metadata; names keep their registration order."""

    def __init__(self, kind: str, **meta_defaults: Any) -> None:
        self.kind = kind
        self.defaults = meta_defaults
        self._entries: dict[str, _Entry] = {}

    def _meta(self, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(meta) - set(self.defaults))
        if unknown:
            allowed = ", ".join(self.defaults) or "none"
            raise ValueError(f"{self.kind} {name!r}: unknown metadata {unknown}; allowed: {allowed}")
        return {**self.defaults, **meta}

    def declare(self, name: str, target: str, **meta: Any) -> None:
        """A built-in: `target` is "module:attribute", imported when the entry is first used."""
        if ":" not in target:
            raise ValueError(f"{self.kind} {name!r}: target must be 'module:attribute', got {target!r}")
        self._entries[name] = _Entry(target, self._meta(name, meta), builtin=True)

    def add(self, name: str, obj: T, **meta: Any) -> T:
        """Register `obj` under `name` and return it; the declared built-in's own object is accepted, any other
        object under a taken name is refused (ValueError naming the holder)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        entry = self._entries.get(name)
        if entry is None:
            self._entries[name] = _Entry(obj, self._meta(name, meta), builtin=False)
            return obj
        same = entry.target is obj or (isinstance(entry.target, str) and entry.target == _describe(obj))
        if not same:
            raise ValueError(f"{self.kind} name {name!r} is already registered to {_describe(entry.target)}")
        entry.target = obj
        if meta:
            entry.meta = {**entry.meta, **self._meta(name, meta)}
        return obj

    def remove(self, name: str) -> None:
        """Forget `name` (a plugin's entry, in tests)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The object registered as `name`, imported on first use (ValueError listing the allowed names)."""
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise ValueError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}")
        if isinstance(entry.target, str):
            module, attribute = entry.target.split(":", 1)
            obj: Any = importlib.import_module(module)  # its decorators may resolve the entry on the way
            for part in attribute.split("."):
                obj = getattr(obj, part)
            entry.target = obj
        return entry.target  # type: ignore[no-any-return]

    def meta(self, name: str) -> dict[str, Any]:
        """The metadata of `name` (ValueError for an unknown name)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}")
        return dict(self._entries[name].meta)

    def names(self, builtin: bool | None = None, **meta: Any) -> list[str]:
        """Registered names in registration order; `builtin` and metadata values filter them."""
        return [
            n
            for n, e in self._entries.items()
            if (builtin is None or e.builtin == builtin) and all(e.meta.get(k) == v for k, v in meta.items())
        ]

    def items(self) -> list[tuple[str, T]]:
        """(name, object) of every entry, importing the built-ins not used yet."""
        return [(n, self.get(n)) for n in list(self._entries)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


# Architectures of other libraries by name, "<library>/<architecture>" (built by calib_core/models/library.py)
MODEL_LIBRARIES = ("torchvision", "timm")


def split_library_name(name: str) -> tuple[str, str] | None:
    """('torchvision', 'resnet50') for 'torchvision/resnet50'; None for a name of the project's own registry."""
    library, sep, arch = name.partition("/") if isinstance(name, str) else ("", "", "")
    if not sep or library not in MODEL_LIBRARIES:
        return None
    return library, arch


def library_name_problem(name: str, field: str = "run.model.name") -> str | None:
    """One line when a library name is malformed or its library is not installed (nothing imported); else None.
    Whether the architecture exists is checked where the model is built (the pre-flight's child process)."""
    parts = split_library_name(name)
    if parts is None:
        return None
    library, arch = parts
    if not arch or "/" in arch:
        return f"{field}: {name!r} must be {library}/<architecture>, e.g. torchvision/resnet50 or timm/resnet18"
    if importlib.util.find_spec(library) is None:
        extra = " (pip install 'calib-sweep[timm]')" if library == "timm" else ""
        return f"{field}: {name!r} needs the {library} package, which is not installed{extra}"
    return None


MODELS: Registry[Any] = Registry("model")
for _name, _target in {
    "mlp": "calib_core.models.mlp:MLP",
    "cnn1d": "calib_core.models.cnn1d:CNN1D",
    "cnn2d": "calib_core.models.cnn2d:CNN2D",
    "resnet18": "calib_core.models.resnet:ResNet18",
    "resnet34": "calib_core.models.resnet:ResNet34",
    "resnet50": "calib_core.models.resnet:ResNet50",
    "wrn28_10": "calib_core.models.wideresnet:WideResNet",
    "vit_small": "calib_core.models.vit:ViT",
}.items():
    MODELS.declare(_name, _target)

DATASETS: Registry[Any] = Registry("dataset", generated=False, augmentable=False, needs_root=False, shape=None)
DATASETS.declare("mnist1d", "calib_core.data.mnist1d:load_mnist1d", generated=True, shape=((40,), 10))
DATASETS.declare("digits", "calib_core.data.digits:load_digits_splits", shape=((1, 8, 8), 10))
for _name, _shape in {
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "svhn": ((3, 32, 32), 10),
    "mnist": ((1, 28, 28), 10),
    "fashionmnist": ((1, 28, 28), 10),
}.items():  # one loader for the torchvision sets: calib_core.data.torchvision_sets.SPECS holds their files
    DATASETS.declare(
        _name, "calib_core.data.torchvision_sets:load_torchvision", augmentable=True, needs_root=True, shape=_shape
    )
DATASETS.declare("digits_mtl", "calib_core.data.multitask:load_digits_mtl", shape=((1, 8, 8), 10))
DATASETS.declare("mnist1d_mtl", "calib_core.data.multitask:load_mnist1d_mtl", generated=True, shape=((40,), 10))
DATASETS.declare("celeba", "calib_core.data.celeba:load_celeba", needs_root=True)  # 40 binary attribute tasks
# the formats users have (files under data.path; their shape depends on the files) and a bundled real table
DATASETS.declare("image_folder", "calib_core.data.image_folder:load_image_folder")
DATASETS.declare("table", "calib_core.data.table:load_table")
DATASETS.declare("arrays", "calib_core.data.arrays:load_arrays")
DATASETS.declare("breast_cancer", "calib_core.data.table:load_breast_cancer_table", shape=((30,), 2))

CALIBRATORS: Registry[Any] = Registry("calibrator")
for _name, _target in {
    "temperature": "calib_core.calibrators.temperature:TemperatureScaling",
    "vector": "calib_core.calibrators.vector:VectorScaling",
    "matrix": "calib_core.calibrators.matrix:MatrixScaling",
    "dirichlet": "calib_core.calibrators.dirichlet:DirichletCalibrator",
    "mlp": "calib_core.calibrators.mlp:MLPCalibrator",
    "last_layer": "calib_core.calibrators.last_layer:LastLayerCalibrator",
}.items():
    CALIBRATORS.declare(_name, _target)

REGISTRIES: dict[str, Registry[Any]] = {"model": MODELS, "dataset": DATASETS, "calibrator": CALIBRATORS}
