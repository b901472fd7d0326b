"""The sweep's contract: what a trial leaves in its checkpoints, the metric keys it reports, the MLflow tags.

One place for the names the trials (sweeps/integrations/ray/trainable.py), the driver (service, tracking, selection,
model_export) and the config checks (sweeps/config.py) must agree on. It imports neither torch,
Ray nor MLflow: validating a config must stay fast (tests/unit/sweeps/test_cli_malformed.py). It imports the
standard library only (tests/unit/test_import_contracts.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeGuard

# ---------------------------------------------------------------------------- checkpoint layout
# Every epoch checkpoint holds STATE_FILE; the final one (the trial's last report) holds all of them.
# The .pt files hold tensors and plain data only and are read with torch.load(weights_only=True):
# nothing under the storage path is unpickled into Python objects.
STATE_FILE = "state.pt"  # the trainer's resumable state
MODEL_FILE = "model.pt"  # the calibrated module's state_dict (completed trials only)
MODEL_SPEC_FILE = "model_spec.json"  # what rebuilds that module (calib_core.export.model_spec)
PREDICTIONS_FILE = "predictions.npz"  # val/test probabilities and labels (sweeps.decide.uncertainty.load_predictions)
SUMMARY_FILE = "summary.json"  # run config, input shape, tasks, calibrator info, status
FINAL_FILE = "final.json"  # the final report itself: a restarted finished trial reports it again
SHIFT_FILE = "shift.json"  # accuracy and ECE per corruption and severity (evaluation.shift)
# The trial's report files (reliability diagrams, shift tables, per-task table), drawn by the trial itself
# (it has torch and the arrays already): REPORT_DIR/<artifact folder>/<file>, logged as they lie.
REPORT_DIR = "report"

# ---------------------------------------------------------------------------- metric keys
SPLITS = ("val", "test")
# calib_core.metrics.METRIC_NAMES (the keys of compute_all, reported every epoch), spelled out because
# importing calib_core.metrics imports torch; tests/unit/sweeps/test_sweep_config.py checks the two agree.
PER_EPOCH_METRICS = ("accuracy", "nll", "brier", "ece", "mce", "rmsce", "sce", "ace", "tace", "classwise_ece", "aurc")
# Less biased calibration estimators, functions of calib_core.metrics by these names, measured after training.
DEBIASED_METRICS = ("debiased_l2_ce", "ece_sweep", "smooth_ece")
# Means over the corruption suite (evaluation.shift).
SHIFT_METRICS = ("shift_ece", "shift_accuracy")
# OOD detection against synthetic inputs (evaluation.ood): `ood_<score>_<measure>`.
OOD_SCORES = ("msp", "entropy")
OOD_METRICS = ("ood_msp_auroc", "ood_entropy_auroc", "ood_msp_fpr95", "ood_entropy_fpr95")
# Measured once after training (not per epoch); shift and OOD only when `evaluation` switches them on.
FINAL_ONLY_METRICS = SHIFT_METRICS + OOD_METRICS + DEBIASED_METRICS
METRIC_NAMES = PER_EPOCH_METRICS + FINAL_ONLY_METRICS
# Temperature scaling on top of each completed trial (evaluation.temperature_on_top, calib_core.posthoc_on_top): a
# second candidate per trial. Its metrics are reported as TS_PREFIX + <split>_<name> (ts_val_ece: cross-fitted on
# validation), its predictions stored as TS_PREFIX + <array> in PREDICTIONS_FILE, its per-task temperatures under
# TS_SUMMARY_KEY in SUMMARY_FILE (the exported model divides its logits by them).
TS_PREFIX = "ts_"
# The Optuna study trial of a reference arm carries its name under this user attribute (no sampled value).
REFERENCE_ATTR = "reference_arm"
TS_SUMMARY_KEY = "temperature_on_top"
# Conformal prediction sets of every candidate (evaluation.conformal_alphas, calib_core.conformal): per method and
# alpha, <split>_<conformal_key> (val cross-fitted on validation folds, test from the quantile of all validation rows),
# and in PREDICTIONS_FILE each row's covered flag and set size under conformal_rows_key (TS_PREFIX for "+ TS").
CONFORMAL_METHODS = ("lac", "aps", "aps_randomized", "raps")
CONFORMAL_MEASURES = ("coverage", "size", "worst_class_coverage", "worst_size_coverage")
CONFORMAL_ROWS = ("covered", "size")  # the measures with bootstrap intervals: the means of these rows
# The champion's conformal quantiles: the key of its model spec ({method: {alpha: quantile}}) and the alphas it
# stores besides the sweep's own (a request for another alpha is refused, naming these)
CONFORMAL_SPEC_KEY = "conformal"
CONFORMAL_SERVED_ALPHAS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
# The multi-objective search: validation accuracy up, validation ECE down.
MULTI_OBJECTIVE = (("val_accuracy", "max"), ("val_ece", "min"))


def grow_experiment(sweep: str, target: int) -> str:
    """The Ray Tune experiment (folder) name of the trials that grew `sweep` to `target` trials."""
    return f"{sweep}.grow{target}"


def metric_key(split: str, name: str) -> str:
    """The reported key of metric `name` on `split` ('val' or 'test'), e.g. val_ece."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return f"{split}_{name}"


def alpha_tag(alpha: float) -> str:
    """alpha in a metric key: 0.1 -> 'a10', 0.025 -> 'a2p5' (percent, no dot)."""
    return "a" + f"{100 * alpha:g}".replace(".", "p")


def conformal_key(method: str, alpha: float, measure: str) -> str:
    """The key of a conformal measure without its split, e.g. cp_aps_a10_size (metric_key adds val_ / test_)."""
    return f"cp_{method}_{alpha_tag(alpha)}_{measure}"


def conformal_rows_key(method: str, alpha: float, split: str, what: str) -> str:
    """The PREDICTIONS_FILE array of each row's `what` (CONFORMAL_ROWS) on `split`, e.g. cp_lac_a10_val_covered."""
    return f"cp_{method}_{alpha_tag(alpha)}_{split}_{what}"


def final_only_keys(shift: bool, ood: bool) -> list[str]:
    """Validation keys that exist only in the final report, given what the evaluation switches on."""
    names = list(DEBIASED_METRICS) + (list(SHIFT_METRICS) if shift else []) + (list(OOD_METRICS) if ood else [])
    return [metric_key("val", m) for m in names]


def is_number(value: Any) -> TypeGuard[int | float]:
    """A real number as a metric (int or float, not bool); NaN counts (a diverged trial's metric)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> TypeGuard[int | float]:
    """A real, finite number (not bool, NaN or infinity): what MLflow can log and a ranking can use."""
    return is_number(value) and math.isfinite(value)


# ---------------------------------------------------------------------------- MLflow tags
TAG_SWEEP = "calib.sweep"  # the sweep's name, on the parent and every child run
TAG_ROLE = "calib.role"  # ROLE_PARENT | ROLE_TRIAL
ROLE_PARENT = "parent"
ROLE_TRIAL = "trial"
TAG_TRIAL = "calib.trial_id"  # Tune's trial id, on the trial's run
TAG_DATASET = "calib.dataset"
TAG_CALIBRATOR = "calib.calibrator"
TAG_METHOD = "calib.method"
TAG_LABEL = "calib.label"  # the trial's short description (describe_params), also its run name
TAG_GIT_COMMIT = "calib.git_commit"  # kept beside MLflow's own for old queries
TAG_NODE = "calib.node_id"  # the Ray node a trial ran on
TAG_STATUS = "calib.status"  # completed | stopped_early | diverged | out_of_memory | errored
TAG_STOP_REASON = "calib.stop_reason"
TAG_REASON = "calib.failure_reason"  # on a failed trial's run and on a failed sweep's parent
# The status of a trial the scheduler (ASHA) stopped at a rung: a normal end, not a failure.
STOPPED_EARLY = "stopped_early"
TAG_LOST_FROM_TUNE = "calib.lost_from_tune"  # a finished run of a trial Tune forgot (selection ignores it)
TAG_LOST_TRIALS = "calib.lost_trials"  # on the parent: trial ids whose runs were dropped on resume
# on the parent: the tracking writer's longest queue (hooks waiting for MLflow) and the seconds Tune's loop waited
# on a full queue (sweeps/integrations/mlflow/sweep_runs.py); a slow tracking server shows here
TAG_QUEUE_MAX = "calib.tracking_queue_max"
TAG_QUEUE_WAIT = "calib.tracking_queue_wait_s"
TAG_GROWN_TO = "calib.grown_to"  # on the parent: the trial counts it was grown to (--resume --num-samples), "16,24"
TAG_CHAMPION_TRIAL = "calib.champion_trial"  # the Tune trial (its run is the champion's run)
# the candidate: the trial id, or "<trial id>+ts" for the trial with temperature scaling on top
TAG_CHAMPION_CANDIDATE = "calib.champion_candidate"
TAG_CHAMPION_RUN = "calib.champion_run"
TAG_SELECTION_RULE = "calib.selection_rule"  # the selection sentence
# The champion's logged model and registered version.
TAG_EXPORT_FORMAT = "calib.export_format"
TAG_EXPORT_COMPLETE = "calib.export_complete"
TAG_SOURCE_RUN = "source_run_id"
# MLflow's own conventions: the parent of a nested run, the run description the UI shows and edits,
# the source commit, and the experiment kind (the UI's "machine learning" workflow rather than GenAI).
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_ML = "custom_model_development"
CHAMPION_ALIAS = "champion"
MEMORY = "memory"  # search.storage: keep the Optuna study only in Ray Tune's experiment state
CHALLENGER_ALIAS = "challenger"  # a new sweep's pick that the champion gate did not let through
# A pick whose accuracy interval reaches the majority-class rate: registered under this alias only, never @champion
NO_BETTER_ALIAS = "no-better-than-majority"
# The champion gate's record on each registered champion's run (sweeps/integrations/mlflow/champion_gate.py).
GATE_DIR = "gate"
GATE_ROWS_FILE = "rows.npz"  # hashes of the raw rows of the training and validation splits
GATE_DATA_FILE = "data.json"  # dataset, input shape, class count and names, input columns, standardisation
TAG_GATE = "calib.gate"  # on a model version: the gate's one-line decision

# ---------------------------------------------------------------------------- the leaderboard
# sweep/leaderboard.csv on the parent run: one row per candidate. Beside its metrics, what the selection rule judged
# (sweeps.selection_rules.choice.Standing), enough to recompute the selection sentence from the file alone.
LEADERBOARD_FILE = "leaderboard.csv"
BOARD_CHAMPION = "champion"  # the rule's pick
BOARD_MOST_ACCURATE = "most_accurate"  # the candidate the accuracy comparisons are made against
BOARD_ACCURACY_GAP = "accuracy_gap"  # its val accuracy minus this one's (point estimates, a fraction, >= 0)
# the one-sided lower confidence bound of (this one's - the most accurate's) val accuracy (margin rule; 0 for itself)
BOARD_ACCURACY_LOWER = "accuracy_lower_bound"
BOARD_ACCURACY_P = "accuracy_p_value"  # one-sided p of "less accurate than the most accurate" (noise_aware rule)
BOARD_ELIGIBLE = "eligible"  # in the set the rule picks from


# ---------------------------------------------------------------------------- the tracking store
class TrackingStore(Protocol):
    """What the service, finish, the API and the tuner ask of the tracking store (its one implementation:
    sweeps/integrations/mlflow/store.MlflowStore, built by the service and by load_result). Runs are found by the
    sweep's tags; a run is the store's record of it (`.info.run_id`, `.data.metrics` / `.params` / `.tags`)."""

    def experiment_id(self, name: str) -> str | None:
        """The id of experiment `name`, or None when there is none."""
        ...

    def ensure_experiment(self, name: str) -> str:
        """The experiment's id, created if needed."""
        ...

    def parent_run(self, experiment_id: str, sweep: str) -> Any | None:
        """The sweep's parent run, or None."""
        ...

    def trial_runs(self, experiment_id: str, sweep: str) -> list[Any]:
        """Every trial run of the sweep."""
        ...

    def trial_runs_by_id(self, experiment_id: str, sweep: str, runs: list[Any] | None = None) -> dict[str, Any]:
        """{trial id: run} of the sweep's trial runs (`runs`: trial_runs' answer already read)."""
        ...

    def get_run(self, run_id: str) -> Any:
        """The run (info, data: metrics, params, tags)."""
        ...

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Set tags on the run, in order (secrets in URIs masked)."""
        ...

    def log_metrics(
        self, run_id: str, metrics: dict[str, float], step: int = 0, timestamp_ms: int | None = None
    ) -> None:
        """Log every metric as given at `step`, stamped `timestamp_ms` or now."""
        ...

    def log_artifacts(self, run_id: str, files: Iterable[tuple[str | Path, str | None]]) -> None:
        """Log each (file, artifact folder) pair; folder None = the run's artifact root."""
        ...

    def download_artifact(self, run_id: str, path: str, dst: str | Path) -> str:
        """Download the run's artifact `path` into `dst`; the local path."""
        ...

    def versions_of_run(self, model_name: str, run_id: str) -> list[Any]:
        """The registered model's versions created from `run_id`, oldest first."""
        ...

    def close_open_runs(self, experiment_id: str, sweep: str, status: str) -> int:
        """Mark every still-running trial run of the sweep with `status`; the count."""
        ...

    def terminate(self, run_id: str, status: str, end_time: int | None = None) -> None:
        """End the run with `status` (FINISHED, FAILED, KILLED), at `end_time` (ms) or now."""
        ...


class ResourcesUnavailable(RuntimeError):
    """Trials waited longer than resources.pending_timeout_s for resources (sweeps.integrations.ray.resource_wait)."""


class SweepError(RuntimeError):
    """The sweep could not run or produced nothing to select."""


class SweepIncomplete(SweepError):
    """The sweep stopped with trials unfinished (interrupted trials, a driver stop): `--resume` continues it."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"sweep stopped with {done}/{total} trials done; continue with --resume")
        self.done, self.total = done, total


@dataclass
class SweepResult:
    """What a finished sweep produced (`sweeps.run_sweep` / `sweeps.load_result`; docs in sweeps/api.py)."""

    name: str
    champion_run_id: str
    champion_trial_id: str
    champion_label: str
    model_uri: str  # models:/<registered model>/<version>: this sweep's champion, for good
    model_version: str
    leaderboard: Any = field(repr=False)  # pandas.DataFrame, as sweep/leaderboard.csv on the parent run
    selection: str = field(repr=False)  # the selection sentence (three lines)
    intervals: dict[str, dict[str, tuple[float, float]]] = field(repr=False)  # trial -> metric -> (low, high)
    confidence: float
    parent_run_id: str
    experiment_id: str
    tracking_uri: str = field(repr=False)
    study_storage: str = field(repr=False)
    replicates: Any = field(default=None, repr=False)  # paired bootstrap replicates (None when loaded from MLflow)
    timings: dict[str, float] = field(default_factory=dict, repr=False)
    best_config: dict[str, Any] = field(default_factory=dict, repr=False)  # the champion's searched values
    errors: list[dict[str, str]] = field(default_factory=list, repr=False)  # trials that did not complete
    # the alias this sweep's version got: "champion", "challenger" (the champion gate) or "no-better-than-majority"
    alias: str = "champion"
    gate: str = field(default="", repr=False)  # the champion gate's line ("" when there was nothing to compare)
    # (name, study_storage) -> the Optuna study: integrations/optuna/study.load_study, set by run_sweep and
    # load_result (this module imports no third-party library)
    study_loader: Callable[[str, str], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def champion_uri(self) -> str:
        """models:/<registered model>@champion (moves to the champion of the latest sweep)."""
        return self.model_uri.rsplit("/", 1)[0] + "@champion"

    @property
    def study(self) -> Any:
        """The sweep's Optuna study (loaded from `study_storage` by `study_loader`), or None for an in-memory study
        (or a result made without a loader)."""
        if self.study_storage == MEMORY or self.study_loader is None:
            return None
        return self.study_loader(self.name, self.study_storage)

    def __repr__(self) -> str:
        trials = 0
        if self.leaderboard is not None and "trial_id" in self.leaderboard:  # candidates: each trial, and its "+ TS"
            trials = self.leaderboard["trial_id"].astype(str).str.split("+").str[0].nunique()
        elif self.leaderboard is not None:
            trials = len(self.leaderboard)
        return (
            f"SweepResult(name={self.name!r}, champion={self.champion_label!r} (trial {self.champion_trial_id}), "
            f"model_uri={self.model_uri!r}, trials={trials}, errors={len(self.errors)})"
        )


# ---------------------------------------------------------------------------- trial failures
# The status of a trial that ran out of memory (calib.status; the leaderboard's status column). Its run is FAILED with
# the reason "out of memory: ...". Policy (README "The sweep"): a failed allocation in the trial (torch's CPU or CUDA
# allocator, Python's MemoryError) ends the trial at once, not retried, since the same config asks for the same memory
# again; a worker that Ray's memory monitor killed (the node ran low, maybe through other trials) is retried from its
# checkpoint like any dead worker, at most resources.max_failures times, and then ends out of memory.
OUT_OF_MEMORY = "out_of_memory"
MEMORY_MONITOR = "memory_monitor"  # memory_failure's kind: Ray's memory monitor killed the trial's worker
ALLOCATION = "allocation"  # memory_failure's kind: an allocation in the trial failed
# How a failed trial's status reads in its reason and in the printed leaderboard (others read as they are).
_STATUS_WORDS = {OUT_OF_MEMORY: "out of memory"}
# Ray's words when its memory monitor kills a worker: the worker's exit type, and the kill message of a task or actor.
_MONITOR_MARKERS = ("node_out_of_memory", "running low on memory")
# The allocators' words: torch's DefaultCPUAllocator ("can't allocate memory" on Linux and macOS, "not enough memory"
# on Windows), CUDA and MPS ("CUDA out of memory", "MPS backend out of memory"), and ENOMEM's strerror.
_ALLOCATION_MARKERS = ("can't allocate memory", "not enough memory", "out of memory", "cannot allocate memory")


def status_words(status: str) -> str:
    """A trial status as people read it: out_of_memory -> 'out of memory'; the others as they are."""
    return _STATUS_WORDS.get(status, status)


def failure_reason(status: str, reason: str) -> str:
    """The reason a failed trial's run records (calib.failure_reason): its status in words, then what happened."""
    return f"{status_words(status)}: {reason}" if reason else status_words(status)


def _first_line_with(text: str, markers: tuple[str, ...]) -> str | None:
    for line in text.splitlines():
        if any(m in line.lower() for m in markers):
            # torch's CPU allocator opens with its assertion ("[enforce fail at alloc_cpu.cpp:127] err == 0."): cut
            at = line.find("DefaultCPUAllocator")
            return " ".join(line[max(at, 0) :].split())
    return None


def memory_failure(error: BaseException | str | None) -> tuple[str, str] | None:
    """(kind, detail) when `error` (an exception, or the text of Tune's error file) says the trial ran out of memory:
    kind MEMORY_MONITOR (Ray's memory monitor killed its worker) or ALLOCATION (an allocation in the trial failed),
    detail the line that says so; None for any other error.

    Classes are matched by name (this module imports neither torch nor Ray): Python's MemoryError, torch's and Ray's
    OutOfMemoryError, and RuntimeError / OSError / Ray errors whose message has the allocators' or the monitor's
    words. Ray's wrappers are looked through: RayTaskError's `cause`, and __cause__ / __context__."""
    if error is None:
        return None
    if isinstance(error, str):
        line = _first_line_with(error, _MONITOR_MARKERS)
        if line is not None:
            return MEMORY_MONITOR, line
        line = _first_line_with(error, _ALLOCATION_MARKERS)
        return (ALLOCATION, line) if line is not None else None
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        exc = todo.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        names = {c.__name__ for c in type(exc).__mro__}
        if "RayTaskError" in names:  # the trial's own exception, wrapped (and subclassed) by Ray: judge the cause
            cause = getattr(exc, "cause", None)
            todo += [cause] if isinstance(cause, BaseException) else []
            continue
        text = str(exc)
        is_ray = "RayError" in names
        if is_ray and (_first_line_with(text, _MONITOR_MARKERS) or "OutOfMemoryError" in names):
            # Ray's OutOfMemoryError is the monitor's kill of a task; its actors die with exit type NODE_OUT_OF_MEMORY.
            line = _first_line_with(text, _MONITOR_MARKERS) or _first_line(text)
            return MEMORY_MONITOR, line
        own = isinstance(exc, MemoryError) or ("OutOfMemoryError" in names and not is_ray)
        if own or (isinstance(exc, (RuntimeError, OSError)) and not is_ray):
            line = _first_line_with(text, _ALLOCATION_MARKERS)
            if own or line is not None:
                return ALLOCATION, line or _first_line(text) or type(exc).__name__
        todo += [
            e for e in (getattr(exc, "cause", None), exc.__cause__, exc.__context__) if isinstance(e, BaseException)
        ]
    return None


def _first_line(text: str) -> str:
    return next((" ".join(ln.split()) for ln in text.splitlines() if ln.strip()), "")


# Ray's words for a trial's actor that died (ray/_raylet: ActorDiedError's message), and what they mean to people
_NODE_DIED = "because its node has died"
_WORKER_DIED = "because its worker process has died"
_QUIET_EXIT = "connection error code 2. End of file"  # the process vanished: SIGKILL, a crash, the kernel's OOM killer
_WORKER_EXIT = re.compile(r"Worker exit type: (\w+)(?: Worker exit detail: ([^.]*))?")


def last_failure(error_text: str) -> str:
    """The last failure in the text of Tune's error file (it appends "Failure # n (occurred at ...)" and the error
    for each failure)."""
    return error_text.rsplit("Failure # ", 1)[-1] if "Failure # " in error_text else error_text


def failure_words(error_text: str) -> str:
    """Why a trial failed, in a few words, from the text of Tune's error file (its last failure): its node died, its
    worker process ended without a word (killed, or crashed), Ray's memory monitor killed it, or the error's last
    line (a trial's own exception)."""
    text = last_failure(error_text)
    oom = memory_failure(text)
    if oom is not None:
        return "Ray's memory monitor killed its worker" if oom[0] == MEMORY_MONITOR else oom[1][:200]
    if _NODE_DIED in text:
        return "its node died"
    if _WORKER_DIED in text:
        exit_ = _WORKER_EXIT.search(text)
        detail = (exit_.group(2) or "").strip() if exit_ else ""
        if not detail or _QUIET_EXIT in text:
            return "its worker process ended without a word (killed, or crashed)"
        return f"its worker process exited ({detail[:150]})"
    lines = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip() and not ln.startswith("Failure # ")]
    return lines[-1][:500] if lines else "trial errored"


def error_ending(error_text: str, attempts: int = 0) -> tuple[str, str]:
    """(status, reason) of a trial Tune ended with an error, from the text of its error file and its `attempts` (Tune's
    failure count): out_of_memory and "out of memory: ..." when the error says so (memory_failure), else errored and
    why in a few words (failure_words)."""
    oom = memory_failure(error_text)
    if oom is None:
        return "errored", failure_words(error_text)
    what = "Ray's memory monitor killed the trial's worker (its node ran low on memory)"
    what = what if oom[0] == MEMORY_MONITOR else oom[1][:300]
    tries = f" on each of its {attempts} attempts (resources.max_failures)" if attempts > 1 else ""
    return OUT_OF_MEMORY, failure_reason(OUT_OF_MEMORY, what + tries)
