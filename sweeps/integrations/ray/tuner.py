"""The sweep's Ray Tune side: the Ray connection, the ASHA scheduler, the Tuner (new, restored, or grown), the
trainable with its resources, and the in-process resume of trials lost with a worker.

The searcher comes from the caller (the service binds integrations/optuna/study.make_searcher to the config) and
the tracking store as the contract's TrackingStore: no other integration is imported here."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from calib_core.config import ConfigError
from calib_core.plugins import plugin_modules
from sweeps.checks.preflight import SEARCH_SPACE_FILE, search_space_problem
from sweeps.config import SweepConfig
from sweeps.contract import (
    TAG_GROWN_TO,
    SweepError,
    TrackingStore,
    grow_experiment,
    memory_failure,
)
from sweeps.integrations.ray.live_hooks import LiveCallbacks, LiveReporter
from sweeps.integrations.ray.progress import ProgressCallback
from sweeps.integrations.ray.trainable import train_trial

if TYPE_CHECKING:
    from ray.tune.search import Searcher


def connect_ray(cluster: bool, plugins: list[str]) -> str | None:
    """Connect to the cluster, or start a local one; the local cluster's session folder (None otherwise)."""
    # Keeping 2 checkpoints per trial forces frequent experiment snapshots; they are cheap here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Snapshot the experiment often: a trial started after the last snapshot is lost if the
    # driver dies (resume then replaces it). Snapshots of sweeps this size cost milliseconds.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    # Tune's automatic loggers would add TensorBoard's, whose tensorboardX imports torch into the driver
    # (~600 MB resident from the first trial on); the sweep asks for the two it reads (result_loggers()).
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    if ray.is_initialized():
        return None
    if cluster:  # the service owns the connection: plugins shipped to every node even without preflight
        from sweeps.integrations.ray.cluster import connect_cluster, plugin_runtime_env

        connect_cluster(plugin_runtime_env(plugins))
        return None
    # Ray annotates logging_level as int; it takes a level name too
    from sweeps.integrations.ray.session import own_session, stop_handlers_kept

    # No idle workers started ahead: Tune gives its trial actors a runtime_env (env_vars), which a prestarted worker
    # never matches, and the sweep runs no other Ray task, so the two the raylet starts by default only spent CPU
    # (~0.7 s per sweep) beside the driver's start-up.
    # a signal to the sweep's process group reaches the driver, not Ray's processes; the driver's handlers stay
    with own_session(), stop_handlers_kept():
        ctx = ray.init(
            include_dashboard=False,
            configure_logging=True,
            logging_level="WARNING",  # type: ignore[arg-type]
            _system_config={"prestart_worker_first_driver": False},
        )
    return str(ctx.address_info["session_dir"])  # type: ignore[attr-defined]  # a RayContext


def result_loggers() -> list[tune.Callback]:
    """Tune's JSON and CSV result files of each trial: its `metrics_dataframe` (the replay of missed MLflow
    writes reads it) and what Tune's own analysis tools read; no TensorBoard files."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [JsonLoggerCallback(), CSVLoggerCallback()]


def make_scheduler(cfg: SweepConfig) -> ASHAScheduler | None:
    """ASHA over epochs for a single objective with `search.scheduler: asha`, else None.

    A trial ends itself after its last epoch, whose report is its final report (done=True, with
    test metrics and the model), and Tune ends a trial on a done report without asking the
    scheduler; so ASHA only stops trials at its rungs before their last epoch, and
    `stop_last_trials=False` keeps it from stopping a trial for reaching max_t (which would
    come before the final report, e.g. if train.epochs is searched past the base value).
    """
    s = cfg.search
    if s.objective != "single" or s.scheduler != "asha":
        return None
    epochs = cfg.run.train.epochs
    return ASHAScheduler(
        time_attr="epoch", max_t=epochs, grace_period=min(s.grace_period, epochs), stop_last_trials=False
    )


def build_tuner(cfg: SweepConfig, trainable: Any, searcher: Searcher, grow_from: int = 0) -> tune.Tuner:
    """A new Tuner; its callbacks and reporter are stand-ins for the installed ones (integrations/ray/live_hooks.py).

    `searcher`: the sweep's search algorithm (integrations/optuna/study.make_searcher with seed offset `grow_from`).
    `grow_from` > 0: the Tuner of the trials that grow a finished sweep of that many trials to
    `search.num_samples`, an experiment of its own (`contract.grow_experiment`) in the same Optuna study."""
    s, r = cfg.search, cfg.resources
    scheduler = make_scheduler(cfg)
    if not grow_from and cfg.storage_path:
        record_search_space(cfg, f"{cfg.storage_path.rstrip('/')}/{cfg.name}")
    metric = mode = None
    if s.objective == "single":
        metric, mode = s.metric, s.mode
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            metric=metric,
            mode=mode,
            num_samples=s.num_samples - grow_from,
            max_concurrent_trials=r.max_concurrent,
            # a trial process keeps torch, the code and cached data loaded
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=grow_experiment(cfg.name, s.num_samples) if grow_from else cfg.name,
            storage_path=cfg.storage_path,
            callbacks=[LiveCallbacks(cfg.name)],
            failure_config=tune.FailureConfig(max_failures=r.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=r.checkpoints_to_keep),
            progress_reporter=LiveReporter(cfg.name),  # none installed: Tune's default output (--verbose)
            verbose=1,
        ),
    )


def make_trainable(cfg: SweepConfig, verbose: bool) -> Any:
    """The trial function with its fixed arguments and per-trial resources."""
    r = cfg.resources
    return tune.with_resources(
        tune.with_parameters(
            train_trial,
            base=cfg.run.model_dump(mode="json"),
            evaluation=cfg.evaluation,
            plugins=plugin_modules(cfg.plugins),
            quiet=not verbose,
        ),
        {"cpu": r.cpus_per_trial, "gpu": r.gpus_per_trial},
    )


class StopWatch(logging.Filter):
    """Whether a stop signal (Ctrl+C's SIGINT, or a SIGTERM routed to it) ended a Ray Tune fit: `requested`.

    Ray Tune handles SIGINT itself and returns from `fit()` as if the experiment had ended, the running trials
    marked TERMINATED in the grid it returns (their saved state still says RUNNING, so --resume continues them).
    Set as a filter on Tune's logger, this sees Tune's own lines for the stop ("Stop signal received",
    "Experiment has been interrupted") and records it; `quiet` keeps those lines (which point at Tuner.restore)
    out: the service says in one line how to continue (--resume)."""

    LINES = ("Stop signal received", "Experiment has been interrupted", "Training has been interrupted")

    def __init__(self, quiet: bool = False) -> None:
        super().__init__()
        self.quiet, self.requested = quiet, False
        self.on_sigterm: Callable[[], None] | None = None  # run (once) when SIGTERM arrives

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.LINES):
            self.requested = True
            return not self.quiet
        return True


@contextlib.contextmanager
def tune_sigint_undone() -> Iterator[None]:
    """Inside, Ray Tune may take SIGINT over; after, the handler from before is back.

    `fit()` installs a handler that, on the first SIGINT, ends the fit and only then puts the previous one back;
    a fit that ends on its own leaves it installed. Ctrl+C (or a SIGTERM routed to it) during selection and
    registration would then be swallowed by a fit that is long over; with the previous handler back it raises
    KeyboardInterrupt there as everywhere else (runs KILLED, exit 130, resumable)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


# Extra in-process resume rounds for trials that died with their worker although retries were left.
LOST_WORKER_ROUNDS = 2


def fit_resuming_lost_workers(
    tuner: Any, exp_path: str, trainable: Any, max_failures: int, stops: StopWatch | None = None
) -> Any:
    """`tuner.fit()`, then resume (from their checkpoints) trials that ended in a worker death.

    Ray Tune 2.60 can count one worker death twice: a trial killed while restoring from its
    checkpoint fails both in-flight calls, the first failure re-queues the trial and the second
    finds it PENDING and errors it for good, retries left or not (seen in tests/e2e/test_sweep_soak.py).
    Such trials are resumed the way `--resume` would, at most LOST_WORKER_ROUNDS times, when
    retries are allowed at all (`resources.max_failures` > 0); trials whose own code raised are not.
    """
    import ray.exceptions

    results = tuner.fit()
    for _ in range(LOST_WORKER_ROUNDS if max_failures > 0 else 0):
        if stops is not None and stops.requested:
            break  # stopped on purpose: the trials are resumed by --resume
        # A worker Ray's memory monitor killed had its max_failures retries already: not resumed again.
        lost = [r for r in results if isinstance(r.error, ray.exceptions.RayActorError) and not memory_failure(r.error)]
        if not lost:
            break
        print(
            f"{len(lost)} trial(s) ended when their worker died; resuming them from their last checkpoint", flush=True
        )
        results = tune.Tuner.restore(exp_path, trainable, resume_unfinished=True, resume_errored=True).fit()
    return results


def should_restore(cfg: SweepConfig, exp_path: str, resume: bool, exists: bool) -> bool:
    """Whether Tune's experiment is restored; a sweep that `exists` in MLflow or Tune is refused without --resume,
    a restore that would search another space than the sweep recorded (record_search_space) with one line."""
    can_restore = restorable(exp_path)
    if not resume and (exists or tune.Tuner.can_restore(exp_path)):
        raise SweepError(
            f"sweep {cfg.name!r} already exists ({exp_path} or MLflow experiment "
            f"{cfg.tracking.experiment!r}); pass --resume to continue it or --name for a new one"
        )
    if resume and can_restore:
        recorded = _read_json(f"{exp_path}/{SEARCH_SPACE_FILE}")
        problem = search_space_problem(cfg, recorded) if isinstance(recorded, dict) else None
        if problem:
            raise ConfigError(problem)
    return resume and can_restore


def restorable(exp_path: str) -> bool:
    """Whether Tune can continue the experiment at `exp_path`: its Tuner file and a snapshot of its state.

    The Tuner file (tuner.pkl) is written when the Tuner is made, the first snapshot once its fit runs: a sweep
    stopped between the two (a Ctrl+C at the end of start-up) has only the first, and `Tuner.restore(...).fit()`
    of it fails ("no experiment state file"); `--resume` makes a new Tuner there instead."""
    if not tune.Tuner.can_restore(exp_path):
        return False
    try:
        from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
    except ImportError:  # another Ray: Tune's own answer
        return True
    try:
        return _find_newest_experiment_checkpoint(exp_path) is not None
    except (OSError, ValueError):
        return True  # unreadable here: Tune's restore says what is wrong


def record_search_space(cfg: SweepConfig, exp_path: str) -> None:
    """What the sweep searches, beside Tune's experiment (local or remote storage), for --resume to compare."""
    import json

    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(exp_path)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{SEARCH_SPACE_FILE}") as out:
            out.write(json.dumps(cfg.search.resumed_space(), sort_keys=True).encode())
    except (OSError, ValueError):  # pyarrow's errors; the check is then skipped on --resume
        pass


def _read_json(uri: str) -> Any:
    import json

    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
        with fs.open_input_stream(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def grown_to(parent: Any | None) -> list[int]:
    """The trial counts an existing sweep was grown to (its parent run's tag), in order."""
    text = parent.data.tags.get(TAG_GROWN_TO, "") if parent is not None else ""
    return [int(x) for x in text.split(",") if x.strip().isdigit()]


def grow_sweep(
    cfg: SweepConfig,
    store: TrackingStore,
    parent_id: str,
    base: Any,
    grown: list[int],
    trainable: Any,
    make_searcher: Callable[[int], Searcher],
    progress: ProgressCallback,
    grow: bool,
    stops: StopWatch | None = None,
) -> list[Any]:
    """The result grids of the experiments that grew the sweep past its first Tune experiment (`base`).

    Earlier growths are restored (an interrupted one resumes); when `grow` (a trial count given with
    --resume) asks for more trials than all of them hold, one more experiment runs the difference in the
    same Optuna study (`make_searcher`, as for build_tuner) and MLflow parent run (`store`). Nothing grows while an
    earlier experiment has unfinished trials, nor after a stop signal (`stops`: Tune reports the trials it stopped
    as TERMINATED, which is not finished)."""
    stopped: Callable[[], bool] = (lambda: stops.requested) if stops is not None else (lambda: False)
    grids: list[Any] = []
    done = len(base)
    unfinished = len(base) - base.num_terminated - base.num_errors
    for target in grown:
        if unfinished:
            break
        path = f"{cfg.storage_path.rstrip('/')}/{grow_experiment(cfg.name, target)}"  # type: ignore[union-attr]
        if not restorable(path):
            break  # recorded on the parent, but its driver died before Tune wrote anything: started again below
        progress.continue_from(done)
        g = tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True).fit()
        grids.append(g)
        done += len(g)
        unfinished += len(g) - g.num_terminated - g.num_errors
        if stopped():
            return grids
    if not grow or unfinished or stopped() or cfg.search.num_samples <= done:
        return grids
    target = cfg.search.num_samples
    if target not in grown:
        store.set_tags(parent_id, {TAG_GROWN_TO: ",".join(str(n) for n in [*grown, target])})
    print(f"Growing {cfg.name!r} from {done} to {target} trials (same Optuna study and MLflow parent run)", flush=True)
    progress.continue_from(done)
    tuner = build_tuner(cfg, trainable, make_searcher(done), grow_from=done)
    grids.append(
        fit_resuming_lost_workers(
            tuner,
            f"{cfg.storage_path}/{grow_experiment(cfg.name, target)}",
            trainable,
            cfg.resources.max_failures,
            stops,
        )
    )
    return grids
