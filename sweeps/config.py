"""Validated sweep configuration: the base run, the search space, resources, tracking, selection."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, create_model, field_validator, model_validator

from calib_core.config import ConfigError, RunConfig, _Strict, apply_overrides, build_model, read_yaml
from calib_core.registry import CALIBRATORS
from sweeps.config_evaluation import EvaluationConfig  # noqa: F401 (re-exported: sweeps.config.EvaluationConfig)

# The metric names live in sweeps.contract (what trials report); the config validates against them.
from sweeps.contract import (  # noqa: F401
    DEBIASED_METRICS,
    FINAL_ONLY_METRICS,
    METRIC_NAMES,
    OOD_METRICS,
    PER_EPOCH_METRICS,
    SHIFT_METRICS,
)
from sweeps.selection_rules import DEFAULT_RULE, RULE_SPECS, check_rule, rule_fields

# What search.calibrators searches when a config does not say: the built-in one-go calibrators. Any
# calibrator registered in calib_core.calibrators (plugins included) may be listed; the names are
# checked against the registry once the rest of the config is valid (SweepConfig._registered).
DEFAULT_CALIBRATORS = tuple(CALIBRATORS.names(builtin=True))
# Reference points a sweep may include beside the one-go calibrators (no calibrator lr is searched):
# plain CE, CE with early stopping on val NLL (search.reference_patience), post-hoc scaling on validation.
BASELINE_CHOICES = ("none", "ce_es", "posthoc_temperature", "posthoc_vector", "posthoc_matrix")
# The reference arms every sweep runs by default, each once, before Optuna samples (search.references).
DEFAULT_REFERENCES = ("ce_es",)
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "mnist1d_demo.yaml"

# Limits of Linux file systems: a whole path and one of its names, in bytes (UTF-8).
PATH_MAX_BYTES, NAME_MAX_BYTES = 4096, 255


def control_character(value: str) -> str | None:
    """'U+XXXX' of the first control character in `value` (C0, DEL, C1; newline and tab included), else None."""
    for c in value:
        if ord(c) < 32 or 127 <= ord(c) < 160:
            return f"U+{ord(c):04X}"
    return None


def path_problem(value: str) -> str | None:
    """Why `value` cannot be used as a local path (a folder, a file, the path of a sqlite:/// URL), else None.

    The one check every path value passes (config file, `--set`, flags) before anything touches the file system:
    no control character (it would be part of a folder name), encodable text, a `~user` of this machine, within
    Linux's length limits."""
    code = control_character(value)
    if code:
        return f"contains a control character ({code}); paths must be plain text"
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid text)"
    if value.startswith("~"):
        head = value.split("/", 1)[0]
        if os.path.expanduser(head) == head:
            return f"{head!r}: no such user on this machine (~ or ~USER, then a path)"
    if len(raw) > PATH_MAX_BYTES:
        return f"longer than {PATH_MAX_BYTES} bytes ({len(raw)})"
    longest = max((len(part.encode("utf-8")) for part in value.split("/")), default=0)
    if longest > NAME_MAX_BYTES:
        return f"a folder or file name in it is longer than {NAME_MAX_BYTES} bytes ({longest})"
    return None


def _uri_problem(v: str) -> str | None:
    """A URI's control characters; a sqlite:/// or file:// URI's path checked as a path."""
    for scheme in ("sqlite:///", "file://"):
        if v.startswith(scheme):
            return path_problem(v.removeprefix(scheme))
    code = control_character(v)
    return f"contains a control character ({code})" if code else None


class LogRange(_Strict):
    """A log-uniform range [low, high] with 0 < low < high."""

    low: float = Field(default=1e-4, gt=0.0)
    high: float = Field(default=1e-1, gt=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> LogRange:
        if not self.low < self.high:
            raise ValueError(f"low must be < high (got low={self.low}, high={self.high})")
        return self


class ExtraParam(_Strict):
    """Another run-config field the search opens, by dotted path (e.g. train.lr)."""

    type: Literal["loguniform", "uniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    values: list[Any] | None = None

    @model_validator(mode="after")
    def _shape(self) -> ExtraParam:
        if self.type == "choice":
            if not self.values:
                raise ValueError("type 'choice' needs a non-empty 'values' list")
        else:
            if self.low is None or self.high is None or not self.low < self.high:
                raise ValueError(f"type '{self.type}' needs low < high")
            if self.type == "loguniform" and self.low <= 0:
                raise ValueError("type 'loguniform' needs low > 0")
        return self


class SearchConfig(_Strict):
    """What Optuna searches and what it optimises (validation metrics only)."""

    num_samples: int = Field(default=8, ge=1)
    calibrators: list[str] = Field(default_factory=lambda: list(DEFAULT_CALIBRATORS))
    calibrator_lr: LogRange = Field(default_factory=LogRange)
    # Reference arms run once each as the sweep's first trials, at the base config's backbone settings (then
    # Optuna samples the rest); [] turns them off (--no-reference-arms). Reference points listed in
    # `calibrators` with no other searched value (`params` empty) run once too, never drawn again.
    references: list[str] = Field(default_factory=lambda: list(DEFAULT_REFERENCES))
    reference_patience: int = Field(
        default=5, ge=1, description="ce_es: epochs without a lower val NLL before CE training stops (best epoch kept)"
    )
    params: dict[str, ExtraParam] = Field(default_factory=dict)
    objective: Literal["single", "multi"] = "multi"
    metric: str = "val_ece"
    mode: Literal["min", "max"] = "min"
    scheduler: Literal["none", "asha"] = "none"
    grace_period: int = Field(default=2, ge=1)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # Optuna's samplers seed numpy: 0 .. 2**32 - 1
    # Where the Optuna study lives, one study per sweep name (continued by --resume): an SQLAlchemy
    # URL (sqlite:////ABS/optuna.db, postgresql://user:pw@host/db, mysql://...), or "memory" (only in
    # Ray Tune's experiment state). None: $CALIB_OPTUNA_STORAGE, else optuna.db beside a SQLite
    # MLflow store, else memory (default_study_storage).
    storage: str | None = None
    # How long the sweep waits for the study's database when it cannot be reached (retrying with backoff,
    # one line when it goes and one when it is back) before it stops, resumable with --resume.
    storage_outage_timeout_s: float = Field(default=600.0, gt=0.0)

    @field_validator("calibrators")
    @classmethod
    def _known_calibrators(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must list at least one calibrator")
        if len(set(v)) != len(v):
            raise ValueError("calibrators must not repeat")
        return v

    @field_validator("references")
    @classmethod
    def _known_references(cls, v: list[str]) -> list[str]:
        unknown = [r for r in v if r not in BASELINE_CHOICES]
        if unknown:
            raise ValueError(f"unknown reference arm {unknown[0]!r}; allowed: {', '.join(BASELINE_CHOICES)}")
        if len(set(v)) != len(v):
            raise ValueError("references must not repeat")
        return v

    def reference_arms(self) -> list[str]:
        """The choices run once each, first: `references`, then reference points listed in `calibrators` when
        nothing else is searched (their runs would repeat)."""
        arms = list(self.references)
        if not self.params:
            arms += [c for c in self.calibrators if c in BASELINE_CHOICES and c not in arms]
        return arms

    def resumed_space(self) -> dict[str, Any]:
        """What a --resume must search as the sweep did (restored trials and searcher, the study), as JSON values."""
        return self.model_dump(mode="json", exclude={"num_samples", "storage", "storage_outage_timeout_s"})

    def sampled_calibrators(self) -> list[str]:
        """The `calibrator` choices Optuna draws from (those not run once as reference arms)."""
        once = set(self.reference_arms()) if not self.params else set()
        return [c for c in self.calibrators if c not in once]

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, v: str | None) -> str | None:
        if v is None or v == "memory":
            return v
        problem = _uri_problem(v)
        if problem:
            raise ValueError(problem)
        if not re.match(r"\A(sqlite:///.+|postgresql(\+\w+)?://.+|mysql(\+\w+)?://.+)\Z", v):
            raise ValueError("must be sqlite:////ABS/PATH.db, postgresql://..., mysql://... or 'memory'")
        return v

    @field_validator("metric")
    @classmethod
    def _val_metric(cls, v: str) -> str:
        if not v.startswith("val_") or v.removeprefix("val_") not in METRIC_NAMES:
            allowed = ", ".join(f"val_{m}" for m in METRIC_NAMES)
            raise ValueError(f"must be a validation metric, one of: {allowed}")
        return v

    @field_validator("params")
    @classmethod
    def _param_paths(cls, v: dict[str, ExtraParam]) -> dict[str, ExtraParam]:
        for key in v:
            if not re.match(r"\A(data|model|train)\.[a-z_][a-z0-9_.]*\Z", key):
                raise ValueError(f"{key!r}: keys are dotted run-config paths under data., model. or train.")
            if key in ("train.calibrator", "train.calibrator_lr", "train.method"):
                raise ValueError(f"{key!r} is searched by 'calibrators' / 'calibrator_lr'")
        return v

    @model_validator(mode="after")
    def _something_to_draw(self) -> SearchConfig:
        arms = self.reference_arms()
        if not self.sampled_calibrators() and self.num_samples > len(arms):
            raise ValueError(
                f"num_samples {self.num_samples} exceeds the {len(arms)} reference arm(s) ({', '.join(arms)}) and "
                "nothing else is searched: list a one-go calibrator in calibrators, open a value in params, or lower "
                "num_samples"
            )
        return self

    @model_validator(mode="after")
    def _scheduler_needs_single(self) -> SearchConfig:
        if self.scheduler == "asha" and self.objective == "multi":
            raise ValueError("scheduler 'asha' needs objective 'single'")
        return self


class ResourcesConfig(_Strict):
    """Per-trial resources and concurrency."""

    cpus_per_trial: float = Field(default=1.0, gt=0.0)
    gpus_per_trial: float = Field(default=0.0, ge=0.0)
    max_concurrent: int = Field(default=2, ge=1)
    max_failures: int = Field(default=2, ge=0)
    # None keeps every epoch checkpoint. With a number, Ray Tune deletes older ones, and a driver killed between a
    # deletion and the next experiment snapshot can leave a trial that --resume cannot restore (it then fails; the
    # sweep goes on). Set it for big models only.
    checkpoints_to_keep: int | None = Field(default=None, ge=1)
    # How long the sweep waits with trials pending and none running (a cluster autoscaling to fit a trial) before it
    # ends with an error; None waits for ever. See sweeps/integrations/ray/resource_wait.py.
    pending_timeout_s: float | None = Field(default=900.0, gt=0.0)
    # Above this many trials the launch says so in one warning line (sizes and time grow with it).
    warn_trials: int = Field(default=1000, ge=1)


class TrackingConfig(_Strict):
    """Where MLflow records the sweep and under which names."""

    uri: str | None = None
    experiment: str = "calib-sweeps"
    # Left unset, with_defaults names it after the data (calibrated-mnist1d; calibrated-table-patients-<digest> for
    # patients.csv: default_registered_model), so other data never meets another's @champion. CLI: --model-name.
    registered_model: str = "calibrated-classifier"
    # True when with_defaults named it after the data (the user left it unset): a resumed sweep then keeps the name
    # it started with, which may be an older default (sweeps/integrations/mlflow/existing.py, started_registered_model)
    _named_after_data: bool = PrivateAttr(default=False)
    # How long the sweep waits for an unreachable tracking server (retrying with backoff, one line
    # when it goes and one when it is back) before it stops, resumable with --resume.
    outage_timeout_s: float = Field(default=600.0, gt=0.0)

    @property
    def registered_model_is_default(self) -> bool:
        """Whether the registered model's name is the default named after the data (the user did not set it)."""
        return self._named_after_data

    @field_validator("uri")
    @classmethod
    def _uri_scheme(cls, v: str | None) -> str | None:
        if v is None:
            return v
        problem = _uri_problem(v)
        if problem:
            raise ValueError(problem)
        if not re.match(
            r"\A(sqlite:///.+|https?://[^/\s]+.*|postgresql(\+\w+)?://.+|mysql(\+\w+)?://.+|databricks.*)\Z", v
        ):
            raise ValueError("must be sqlite:///ABS/PATH.db, http(s)://host[:port], postgresql://... or mysql://...")
        return v


class _SelectionShared(_Strict):
    """How the champion is chosen from validation metrics: the rule (sweeps/selection_rules/, one module a rule) and
    the settings it reads. Each rule's own settings are defined by its model there (defaults, bounds, descriptions)
    and sit here flat, as configs write them: `selection.max_accuracy_loss`, not `selection.margin.max_accuracy_loss`.
    """

    # margin (default): among candidates shown to be within `max_accuracy_loss` points of the most accurate's val
    # accuracy (one-sided paired bootstrap lower bound at `confidence` above minus it), the best `metric`;
    # ties broken by val NLL. `--help` ends with every rule and what it reads.
    rule: str = DEFAULT_RULE
    metric: str = "val_ece"
    mode: Literal["min", "max"] = "min"
    confidence: float = Field(default=0.95, ge=0.5, le=0.999, description="level of tests and intervals")
    num_resamples: int = Field(default=1000, ge=100, le=20000, description="bootstrap resamples per split")

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str) -> str:
        return check_rule(v)

    @field_validator("metric")
    @classmethod
    def _val_metric(cls, v: str) -> str:
        return SearchConfig._val_metric(v)  # selection sees validation metrics only, never test

    def rule_settings(self) -> dict[str, Any]:
        """The values of the settings the configured rule reads, by name (recorded with its choice)."""
        return {name: getattr(self, name) for name in RULE_SPECS[self.rule].reads}


# The shared settings plus every rule's own (sweeps.selection_rules.rule_fields): a rule added there is a
# setting here without an edit. The type checker sees the shared part; the rules read their own settings.
if TYPE_CHECKING:
    SelectionConfig = _SelectionShared
else:
    SelectionConfig = create_model("SelectionConfig", __base__=_SelectionShared, __module__=__name__, **rule_fields())
    SelectionConfig.__doc__ = _SelectionShared.__doc__


class SweepConfig(_Strict):
    """A whole sweep: the base run config plus search, resources, tracking and selection."""

    name: str = "mnist1d-demo"
    # Modules that register models, datasets or calibrators (calib_core/plugins.py, docs/extending.md),
    # imported before the names are checked, and in every trial process.
    plugins: list[str] = Field(default_factory=list)
    storage_path: str | None = None
    run: RunConfig = Field(default_factory=RunConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)

    @model_validator(mode="after")
    def _shift_metric_needs_shift(self) -> SweepConfig:
        uses = {self.selection.metric}
        if self.search.objective == "single":
            uses.add(self.search.metric)
        shift_keys = {f"val_{m}" for m in SHIFT_METRICS}
        if uses & shift_keys and not self.evaluation.shift:
            used = ", ".join(sorted(uses & shift_keys))
            raise ValueError(f"search.metric / selection.metric {used} needs evaluation.shift: true")
        if any(m.removeprefix("val_") in OOD_METRICS for m in uses) and self.evaluation.ood == "none":
            raise ValueError(
                "search.metric / selection.metric: OOD metrics need evaluation.ood: gaussian_noise or permuted"
            )
        final_only = {f"val_{m}" for m in FINAL_ONLY_METRICS}
        if self.search.scheduler == "asha" and self.search.metric in final_only:
            raise ValueError(
                f"search.scheduler: {self.search.metric} is measured once after training, so ASHA cannot use it"
            )
        return self

    @model_validator(mode="after")
    def _frozen_backbone_has_a_player(self) -> SweepConfig:
        # frozen backbone, last layer as calibrator: one-go's backbone player has nothing to train (trials would fail)
        if self.run.model.freeze == "head_only" and "last_layer" in self.search.calibrators:
            raise ValueError(
                "search.calibrators: 'last_layer' with run.model.freeze 'head_only' leaves the backbone player "
                "nothing to train; drop last_layer or set run.model.freeze: none"
            )
        return self

    @model_validator(mode="after")
    def _registered(self) -> SweepConfig:
        """Plugins imported, then every model, dataset and calibrator name checked against the registries
        (runs only when every other value is valid: load_sweep_config defers RunConfig's own check here)."""
        from calib_core.plugins import load_plugins, name_problem, run_config_problems

        load_plugins(self.plugins)
        problems = run_config_problems(self.run, prefix="run.")
        for c in self.search.calibrators:
            if c not in BASELINE_CHOICES:
                problem = name_problem("calibrator", "search.calibrators", c)
                if problem:
                    problems.append(f"{problem}; or a reference point: {', '.join(BASELINE_CHOICES)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("plugins")
    @classmethod
    def _module_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.match(r"\A[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z", name):
                raise ValueError(f"{name!r} is not a module name (e.g. my_plugins or my_pkg.calibration)")
        return v

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not re.match(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z", v):
            raise ValueError("must be 1-100 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_scheme(cls, v: str | None) -> str | None:
        if v is None:
            return v
        problem = _uri_problem(v) if "://" in v else path_problem(v)
        if problem:
            raise ValueError(problem)
        if "://" in v and not re.match(r"^(s3|gs|gcs|abfs|hdfs|file|memory)://.+", v):
            raise ValueError("must be a directory path or an s3://, gs://, abfs://, hdfs:// or file:// URI")
        return v


def load_sweep_config(
    path: str | Path | None, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> SweepConfig:
    """Load a SweepConfig from YAML (default: the embedded MNIST-1D demo) plus `--set` overrides (text, read as
    YAML) plus `values` by dotted key (the command line's flags: taken as given, not read as YAML), all validated
    together by the one schema."""
    raw = apply_overrides(read_yaml(path if path is not None else DEFAULT_CONFIG), overrides or [])
    for key, value in (values or {}).items():
        node = raw
        for k in key.split(".")[:-1]:
            if node.get(k) is None:
                node[k] = {}
            if not isinstance(node[k], dict):
                raise ConfigError(f"{k}: must be a section (a mapping of settings), not {type(node[k]).__name__}")
            node = node[k]
        node[key.split(".")[-1]] = value
    return build_model(SweepConfig, raw)
