"""Validated configuration of one training run (data, model, trainer) and its YAML loading.

The sweep service embeds these models in its own config, so one schema serves both
`python -m calib_core.train` and `python sweeps/launch.py`.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from calib_core.redaction import redact_text

# Names come from the registries (calib_core.models, calib_core.data, calib_core.calibrators, plus
# plugins): the entry points check them once the schema is valid (calib_core.plugins.build_run_config,
# SweepConfig._registered), so this schema imports no registry.
DatasetName = str
ModelName = str
Method = Literal["onego", "ce", "posthoc", "label_smoothing", "focal"]
CalibratorName = str  # a registered calibrator, or "none"
PosthocName = Literal["temperature", "vector", "matrix"]

_CALIB_DATA = re.compile(r"\A(same|lookahead|holdout:(0?\.\d+|1e-\d+))\Z")


INT_LIMIT = 2**63 - 1  # the largest integer a config value may hold (C long, Ray and SQLite integers)


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field annotation (through Optional, unions and Annotated) admits one of `kinds` or Any."""
    if annotation is Any or annotation in kinds:
        return True
    return any(_admits(a, kinds) for a in get_args(annotation))


class _Strict(BaseModel):
    """The one base of every config model (calib_core's and the sweep's): unknown keys refused, values
    checked on assignment, NaN/inf refused (`lr: .inf`), no boolean where a number is expected
    (`epochs: true` is not 1) and no integer beyond INT_LIMIT, each error naming its field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return v
        if isinstance(v, bool) and _admits(field.annotation, (int, float)) and not _admits(field.annotation, (bool,)):
            raise ValueError("expected a number, not a boolean")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT_LIMIT:
            raise ValueError(f"integer out of range (at most {INT_LIMIT} in absolute value)")
        return v


MAX_HELD_OUT = 0.98  # val + test share of a dataset: the train split keeps the rest
MAX_IMAGE_SIDE = 4096  # data.image_size, in pixels

# The file-format datasets and the DataConfig fields each one reads (every other dataset leaves them unset).
FILE_FIELDS: dict[str, tuple[str, ...]] = {
    "image_folder": ("path", "image_size", "image_mode", "normalize", "mean", "std"),
    "table": ("path", "label_column", "feature_columns", "categorical", "text_columns", "missing", "normalize"),
    "arrays": ("path", "x_key", "y_key", "normalize"),
    "breast_cancer": ("normalize",),
}
FILE_FIELD_FORMATS: dict[str, list[str]] = {}
for _fmt, _fields in FILE_FIELDS.items():
    for _f in _fields:
        FILE_FIELD_FORMATS.setdefault(_f, []).append(_fmt)


def absolute_path(v: str | None) -> str | None:
    """A file path made absolute against the working directory where the config is read (the sweep's driver):
    trials run in directories of their own, and the resolved config shows the file that will be read."""
    if v is None:
        return None
    if not v.strip():
        raise ValueError("must be a file path")
    expanded = os.path.expanduser(v)
    if (v.startswith("~") and expanded == v) or any(ord(ch) < 32 or ord(ch) == 127 for ch in v):
        return v  # a ~user that does not exist, a control character: left for the path check to name
    return os.path.abspath(expanded)


FILE_PATH_HELP = {
    "image_folder": "a folder with one sub-folder of images per class",
    "table": "a .csv or .parquet file",
    "arrays": "an .npz file with arrays x and y (or X/y, data/target, features/labels), or a folder of .npy files",
}


class DataConfig(_Strict):
    """Which dataset, where it lives, and how it is split (train / val / test, fixed by seed)."""

    name: DatasetName = "mnist1d"
    root: str | None = None
    download: bool = False
    num_samples: int | None = Field(
        default=None, ge=100, le=1_000_000, description="total samples for generated sets (mnist1d), at most 10^6"
    )
    val_fraction: float = Field(default=0.15, gt=0.0, lt=0.5)
    test_fraction: float = Field(
        default=0.15,
        gt=0.0,
        lt=1.0,
        description="share of the examples held out for test; a large test split tightens per-run metric intervals",
    )
    augment: bool = False
    label_noise: float = Field(
        default=0.0,
        ge=0.0,
        lt=0.9,
        description="symmetric label noise in every split: each label is replaced by another class with this "
        "probability (single-task data; calib_core.data.perturb)",
    )
    imbalance_ratio: float | None = Field(
        default=None,
        ge=1.0,
        le=1000.0,
        description="long-tailed class profile in every split: class k keeps ratio ** (-k / (K - 1)) of its "
        "examples (single-task data; None = as loaded)",
    )
    verify_checksums: bool = Field(
        default=True,
        description="check torchvision datasets' files against the official md5 sums (false for re-packed copies)",
    )
    # the file formats (calib_core/data/image_folder.py, table.py, arrays.py); FILE_FIELDS says which applies where
    path: str | None = Field(
        default=None,
        description="image_folder: the folder with one sub-folder per class; table: a .csv or .parquet file; "
        "arrays: an .npz file with x and y (data.x_key, data.y_key), or a folder with x.npy and y.npy",
    )
    label_column: str | None = Field(default=None, description="table: the column that holds the class labels")
    feature_columns: list[str] | None = Field(
        default=None, description="table: the feature columns, in order (None: every column but the label)"
    )
    categorical: Literal["onehot", "reject"] = Field(
        default="reject",
        description="table: non-numeric feature columns one-hot encoded (categories from the train split) or refused",
    )
    text_columns: Literal["reject", "drop", "onehot"] = Field(
        default="reject",
        description="table: free-text columns (more than 20 distinct values, over half of the non-empty cells "
        "distinct or the typical value 3+ words; calib_core/data/table.py) refused, left out of the model's "
        "inputs, or one-hot encoded as categories",
    )
    x_key: str | None = Field(
        default=None,
        description="arrays: the features' array in the .npz (or <x_key>.npy in a folder); None: whichever of x, X, "
        "data, features the file holds",
    )
    y_key: str | None = Field(
        default=None,
        description="arrays: the labels' array in the .npz (or <y_key>.npy in a folder); None: whichever of y, "
        "target, labels the file holds",
    )
    missing: Literal["reject", "impute_mean"] = Field(
        default="reject",
        description="table: empty cells refused, or filled with the train split's column mean (numeric columns)",
    )
    image_size: int | tuple[int, int] | None = Field(
        default=None,
        description="image_folder: resize every image to this size (one int: square; [height, width]); None: "
        "the images must share one size",
    )
    image_mode: Literal["RGB", "L"] = Field(
        default="RGB", description="image_folder: decode as 3-channel colour (RGB) or 1-channel grey (L)"
    )
    normalize: Literal["train", "imagenet", "model", "none"] = Field(
        default="train",
        description="image_folder, table, arrays: standardise with the train split's mean/std ('train'), with "
        "ImageNet's (image_folder only, for backbones pretrained on it), with the backbone's own ('model': "
        "data.mean/data.std, filled from a torchvision/ or timm/ model), or not at all",
    )
    mean: tuple[float, float, float] | None = Field(
        default=None,
        description="image_folder with normalize 'model': the per-channel (R, G, B) mean the backbone's weights "
        "expect; filled from run.model.name for torchvision/ and timm/ models",
    )
    std: tuple[float, float, float] | None = Field(
        default=None, description="image_folder with normalize 'model': the per-channel (R, G, B) std, > 0"
    )

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, v: str | None) -> str | None:
        return absolute_path(v)

    @field_validator("x_key", "y_key")
    @classmethod
    def _check_array_key(cls, v: str | None) -> str | None:
        # an .npz member name: numpy saves array `k` as `k.npy`, so a path separator cannot name one
        if v is not None and (not v.strip() or "/" in v or "\\" in v or v.endswith(".npy")):
            raise ValueError(f"must be an array name as saved by numpy.savez (like X or y), got {v!r}")
        return v

    @field_validator("image_size")
    @classmethod
    def _check_image_size(cls, v: int | tuple[int, int] | None) -> int | tuple[int, int] | None:
        sizes = (v,) if isinstance(v, int) else (v or ())
        if any(s < 1 or s > MAX_IMAGE_SIDE for s in sizes):
            raise ValueError(f"must be between 1 and {MAX_IMAGE_SIDE} pixels (one int, or [height, width])")
        return v

    @model_validator(mode="after")
    def _check_fractions(self) -> DataConfig:
        if self.val_fraction + self.test_fraction > MAX_HELD_OUT:
            raise ValueError(
                f"data.val_fraction + data.test_fraction must be at most {MAX_HELD_OUT} (train keeps at least "
                f"{1 - MAX_HELD_OUT:.0%}), got {self.val_fraction:g} + {self.test_fraction:g}"
            )
        return self

    @model_validator(mode="after")
    def _check_file_fields(self) -> DataConfig:
        """The file-format fields apply to their formats only; `path` (and a table's label column) are required."""
        from calib_core.registry import DATASETS  # imports nothing of the project

        formats = FILE_FIELDS.get(self.name)
        # a built-in that does not read a field refuses it; a plugin's loader may read any of them
        builtin = self.name in FILE_FIELDS or self.name in DATASETS.names(builtin=True)
        for field, where in FILE_FIELD_FORMATS.items():
            # a value other than the default, not `model_fields_set`: a dumped config holds every field
            changed = getattr(self, field) != DataConfig.model_fields[field].default
            if changed and builtin and (formats is None or field not in formats):
                raise ValueError(f"data.{field} applies to {', '.join(where)} only, not {self.name!r}; leave it unset")
        if self.name in FILE_PATH_HELP and self.path is None:
            raise ValueError(f"data.path must be set for {self.name} ({FILE_PATH_HELP[self.name]})")
        if self.x_key is not None and self.x_key == self.y_key:
            raise ValueError(f"data.x_key and data.y_key name the same array {self.x_key!r}; the labels need their own")
        if self.name == "table" and self.label_column is None:
            raise ValueError("data.label_column must be set for table (the column that holds the class labels)")
        if self.normalize in ("imagenet", "model") and self.name in FILE_FIELDS and self.name != "image_folder":
            raise ValueError(
                f"data.normalize {self.normalize!r} applies to image_folder only; for {self.name} use train or none"
            )
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"data.std must be > 0 per channel, got {list(self.std)}")
        return self


class ModelConfig(_Strict):
    """Backbone architecture from the model registry and its keyword arguments."""

    name: ModelName = "cnn1d"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    weights: str | None = Field(
        default=None,
        description="a local file of pretrained weights loaded into the model before training: a state dict "
        "saved with torch.save (read with weights_only=True) or a TorchScript file (calib_core/models/pretrained.py)",
    )
    freeze: Literal["none", "head_only"] = Field(
        default="none",
        description="'head_only': train only the head (and the calibrator) on top of frozen weights (a linear "
        "probe); 'none': fine-tune everything (train.lr for the backbone, train.head_lr for the head)",
    )

    @field_validator("weights")
    @classmethod
    def _absolute_weights(cls, v: str | None) -> str | None:
        return absolute_path(v)

    @model_validator(mode="after")
    def _check_freeze(self) -> ModelConfig:
        if self.freeze == "head_only" and not self.weights:
            raise ValueError(
                "model.freeze 'head_only' needs model.weights (a frozen random backbone learns nothing); "
                "allowed without weights: none"
            )
        return self


class TrainConfig(_Strict):
    """The trainer: backbone optimisation, the one-go calibrator options, and the baselines."""

    method: Method = "onego"
    epochs: int = Field(default=30, ge=1)
    batch_size: int = Field(default=128, ge=1)
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(default=1e-3, gt=0.0)
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    lr_schedule: Literal["none", "cosine", "step"] = "cosine"
    max_grad_norm: float | None = Field(default=None, gt=0.0)
    head_lr: float | None = Field(
        default=None,
        gt=0.0,
        description="learning rate of the model's head (its last linear layer) in the backbone optimizer; None = lr",
    )

    calibrator: CalibratorName = "temperature"
    calibrator_lr: float = Field(default=1e-2, gt=0.0)
    calibrator_optimizer: Literal["sgd", "adam"] = "adam"
    calibrator_steps: int = Field(default=1, ge=1, description="K_c: calibrator steps per backbone step")
    warmup_epochs: int = Field(default=0, ge=0)
    calibrator_data: str = "holdout:0.1"
    hypergradient: Literal["first_order", "unrolled"] = "first_order"
    calibrator_kwargs: dict[str, Any] = Field(default_factory=dict)

    posthoc_calibrator: PosthocName = "temperature"
    posthoc_split: Literal["holdout", "val"] = Field(
        default="val",
        description="where method 'posthoc' fits its calibrator: the validation split (default: the backbone trains "
        "on the whole training split; validation metrics are k-fold cross-fitted, see posthoc_folds), or the "
        "training holdout (calibrator_data; the weaker variant in protocol A: +0.74 pt ECE, -2.27 pt accuracy)",
    )
    posthoc_folds: int = Field(
        default=5, ge=2, description="k of the cross-fitted validation metrics with posthoc_split 'val'"
    )
    posthoc_refit: Literal["every_epoch", "end"] = Field(
        default="every_epoch",
        description="method 'posthoc': refit after every epoch (every epoch's validation metrics are calibrated) or "
        "once after training (one calibration stage; per-epoch validation metrics are uncalibrated)",
    )
    early_stopping_patience: int | None = Field(
        default=None,
        ge=1,
        description="stop after this many epochs without a lower validation NLL and return the model of the "
        "best epoch (None: train every epoch, return the last one)",
    )
    label_smoothing: float = Field(default=0.1, ge=0.0, lt=1.0)
    focal_gamma: float | None = Field(default=None, ge=0.0, description="None = FLSD-53 schedule")

    num_bins: int = Field(default=15, ge=1)
    divergence_loss: float | None = Field(
        default=1e4,
        gt=0.0,
        description="a batch loss above this (or NaN/inf) stops the run as 'diverged'; None: only NaN/inf",
    )

    @field_validator("calibrator_data")
    @classmethod
    def _check_calibrator_data(cls, v: str) -> str:
        if not _CALIB_DATA.match(v):
            raise ValueError("must be 'same', 'lookahead' or 'holdout:f' with 0 < f < 1 (e.g. 'holdout:0.1')")
        return v

    @property
    def holdout_fraction(self) -> float:
        """Fraction of the training split held out for the calibrator (0 when not a holdout)."""
        return float(self.calibrator_data.split(":")[1]) if self.calibrator_data.startswith("holdout:") else 0.0

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        holdout = self.calibrator_data.startswith("holdout:")
        if self.method == "posthoc" and self.posthoc_split == "holdout" and not holdout:
            raise ValueError(
                "method 'posthoc' fits on held-out data: calibrator_data must be 'holdout:f' (or posthoc_split 'val')"
            )
        if self.method == "onego" and self.calibrator == "none":
            raise ValueError("method 'onego' needs a calibrator (not 'none'); use method 'ce' for plain CE")
        if (
            self.head_lr is not None
            and self.method == "onego"
            and self.calibrator == "last_layer"
            and not self.warmup_epochs
        ):
            raise ValueError(
                "train.head_lr has no effect with method 'onego' and calibrator 'last_layer' (the head "
                "is the calibrator, trained at calibrator_lr) unless warmup_epochs > 0"
            )
        if self.hypergradient == "unrolled" and self.calibrator in ("last_layer", "mlp"):
            raise ValueError("hypergradient 'unrolled' supports temperature, vector, matrix and dirichlet calibrators")
        return self


class RunConfig(_Strict):
    """Everything one training run needs: seed, device, data, model and trainer."""

    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="numpy's seeds are 0 .. 2**32 - 1")
    device: str = "auto"
    num_threads: int | None = Field(default=None, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if not re.match(r"\A(auto|cpu|cuda(:\d+)?)\Z", v):
            raise ValueError("must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
        return v

    @model_validator(mode="after")
    def _library_input(self) -> RunConfig:
        """A torchvision/ or timm/ backbone on an image folder: the input size and normalisation its weights
        expect become the data's defaults (calib_core/models/library.py), so training and the champion use them."""
        from calib_core.registry import split_library_name  # imports nothing of the project

        d = self.data
        if split_library_name(self.model.name) is None or d.name != "image_folder":
            if d.normalize == "model" and (d.mean is None or d.std is None):
                raise ValueError(
                    "data.normalize 'model' needs data.mean and data.std (filled by itself for a torchvision/ or "
                    "timm/ run.model.name); allowed otherwise: train, imagenet, none"
                )
            return self
        if d.image_mode != "RGB":
            raise ValueError(
                f"data.image_mode {d.image_mode!r}: {self.model.name} takes 3-channel images; use RGB (grey images "
                "become 3 equal channels)"
            )
        fill_norm = d.normalize == "model" and (d.mean is None or d.std is None)
        fill_norm = fill_norm or (d.normalize == "train" and "normalize" not in d.model_fields_set)
        if d.image_size is None or fill_norm:
            from calib_core.models.library import input_spec  # imports torch and the library

            try:
                spec = input_spec(self.model.name)
            except ValueError as exc:
                raise ValueError(str(exc).removeprefix("run.")) from None
            if d.image_size is None:
                d.image_size = spec.size
            if fill_norm:
                d.mean = d.mean or spec.mean
                d.std = d.std or spec.std
                d.normalize = "model"
        return self


class ConfigError(ValueError):
    """A configuration problem, already formatted as one line per bad field."""


MAX_ECHO = 60  # characters of a value (or a field path) echoed in an error line
MAX_PROBLEMS = 5  # problems listed in one error line; the rest are counted


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut to at most `limit` characters, saying how long it was (error lines echo user input); the secrets
    of any URI in it masked first, since a cut before a password's end leaves nothing for the mask to find."""
    text = redact_text(text)
    if len(text) <= limit:
        return text
    suffix = f"…({len(text)} characters)"
    return text[: max(0, limit - len(suffix))] + suffix


def format_validation_error(err: ValidationError) -> str:
    """One line: 'field.path: message (got value)' per problem, values and paths clipped, at most MAX_PROBLEMS."""
    lines = []
    for e in err.errors():
        path = clip(".".join(str(p) for p in e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if not path:  # a rule across fields: its message names them
            lines.append(clip(msg, 200))
        elif e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key")
        else:  # lists and mappings too: "should be a valid number" alone hides what was given
            lines.append(f"{path}: {clip(msg, 200)} (got {clip(repr(got))})")
    more = len(lines) - MAX_PROBLEMS
    return "; ".join(lines[:MAX_PROBLEMS]) + (f"; and {more} more problems" if more > 0 else "")


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse 'a.b.c=value' into (['a','b','c'], value) with the value read as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {clip(item)!r}: empty key")
    if len(item) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--set {clip(key)}: the value is longer than {MAX_CONFIG_BYTES} characters")
    try:
        value = load_bounded_yaml(raw, f"--set {clip(key)}") if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {clip(item)!r}: value is not valid YAML ({exc.__class__.__name__})") from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of a raw config dict with dotted `key=value` overrides applied."""
    out: dict[str, Any] = _deepcopy(raw)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for k in keys[:-1]:
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a section")
            node = nxt
        node[keys[-1]] = value
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {seen[key].line + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _yaml_error_line(p: Path, text: str, exc: yaml.YAMLError) -> str:
    """A YAML error as one line: 'FILE:LINE:COLUMN: problem (context)'."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}"
        problem = exc.problem or "invalid YAML"
        if exc.context:
            ctx = exc.context
            if exc.context_mark is not None and exc.context_mark.line != mark.line:
                ctx += f" on line {exc.context_mark.line + 1}"
            problem += f" ({ctx})"
        return f"{where}: not valid YAML: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):  # a control character, e.g. a stray NUL byte
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"{p}:{line}:{column}: not valid YAML: control character U+{code:04X} is not allowed"
    return f"{p}: not valid YAML: {' '.join(str(exc).split())}"


MAX_CONFIG_BYTES = 1 << 20  # a config file (or one --set value) of at most 1 MiB
MAX_YAML_NODES = 100_000  # values in a document once every alias is expanded (an alias bomb has billions)
MAX_YAML_DEPTH = 64  # nesting of mappings and lists


def _node_bounds(root: yaml.Node, where: str) -> None:
    """Refuse a YAML node graph whose expanded size or depth exceeds the limits, without expanding it."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_YAML_NODES:
                raise ConfigError(f"{where}: more than {MAX_YAML_NODES} values once aliases are expanded")
            if depth[key] > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: nested deeper than {MAX_YAML_DEPTH} levels")
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(f"{where}: a recursive alias (a value that contains itself)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_bounded_yaml(text: str, where: str) -> Any:
    """YAML -> Python with bounded size, depth and aliases (checked on the node graph before anything is built)."""
    loader = _UniqueKeyLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(f"{where}: nested deeper than {MAX_YAML_DEPTH} levels") from None
        if node is None:
            return None
        _node_bounds(node, where)
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise ConfigError(f"{where}: a value cannot be read ({clip(str(exc), 120)})") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path | None) -> dict[str, Any]:
    """Read a YAML mapping from a file (empty mapping when path is None).

    Every problem is one line naming the file: missing, a directory, unreadable, not UTF-8,
    YAML syntax (with line and column), a key given twice, empty, or not a mapping.
    """
    if path is None:
        return {}
    p = Path(path)
    if "\x00" in str(p):
        raise ConfigError(f"config path {clip(repr(str(p)))}: contains a NUL byte")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {clip(str(p), 200)}") from None
    except OSError as exc:
        raise ConfigError(f"{clip(str(p), 200)}: cannot read the config file ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{p}: is a directory, not a config file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
        raise ConfigError(f"{p}: not a regular file (a pipe, socket or device); give a YAML file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: {st.st_size} bytes; a config file may have at most {MAX_CONFIG_BYTES}")
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: a config file may have at most {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise ConfigError(
            f"{p}:{line}:{column}: not UTF-8 text (byte 0x{data[start]:02x}); save the config as UTF-8"
        ) from None
    try:
        raw = load_bounded_yaml(text, str(p))
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_line(p, text, exc)) from None
    if raw is None:
        raise ConfigError(f"{p}: the config file is empty (it should be a YAML mapping of settings)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(raw).__name__}")
    return raw


def build_model(cls: type[BaseModel], raw: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
    """Validate a raw dict into `cls`, turning pydantic errors into a one-line ConfigError."""
    try:
        return cls.model_validate(raw, context=context)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
