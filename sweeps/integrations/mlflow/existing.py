"""Whether a sweep of this name exists already (MLflow parent run, Optuna study, Ray Tune folder), read only:
a new sweep must not reuse a name, and `--resume` of a finished sweep has nothing to do."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError
from calib_core.redaction import redact
from sweeps.contract import CHAMPION_ALIAS, TAG_CHAMPION_RUN, TAG_CHAMPION_TRIAL, TAG_LOST_FROM_TUNE

if TYPE_CHECKING:
    from sweeps.config import SweepConfig


def _study_exists(url: str, name: str) -> bool:
    """Whether the Optuna storage at `url` holds a study `name`, reading only (a SQLite file that does
    not exist is not created, tables are never created)."""
    if url == "memory":
        return False
    if url.startswith("sqlite:///"):
        import sqlite3

        db = Path(url.removeprefix("sqlite:///"))
        if not db.is_file() or db.stat().st_size == 0:
            return False
        try:
            with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
                row = con.execute("SELECT 1 FROM studies WHERE study_name = ?", (name,)).fetchone()
        except sqlite3.OperationalError:
            return False  # no Optuna tables in it (yet)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"search.storage: cannot read the Optuna study database {db}: {exc}") from None
        return row is not None
    import sqlalchemy

    # Plain SQLAlchemy, not RDBStorage: RDBStorage reads its version table while it is built, which
    # fails on a database the study has not created its tables in yet (a new PostgreSQL database).
    try:
        engine = sqlalchemy.create_engine(url)
    except Exception as exc:
        raise ConfigError(
            f"search.storage: cannot open the Optuna storage at {redact(url)}: {' '.join(str(exc).split())[:300]}"
        ) from None
    try:
        with engine.connect() as con:
            if not sqlalchemy.inspect(con).has_table("studies"):
                return False  # no Optuna tables in that database yet
            row = con.execute(sqlalchemy.text("SELECT 1 FROM studies WHERE study_name = :name"), {"name": name}).first()
    except Exception as exc:
        raise ConfigError(
            f"search.storage: cannot read the Optuna storage at {redact(url)}: {' '.join(str(exc).split())[:300]}"
        ) from None
    finally:
        engine.dispose()
    return row is not None


# The parent run's param holding the name the sweep registers under (its config as params, flattened, when it began).
PARAM_REGISTERED_MODEL = "tracking.registered_model"


def started_registered_model(cfg: SweepConfig, parent: Any | None) -> str:
    """The name a sweep's champion registers under: `tracking.registered_model` when the user set it, else the name
    the sweep's parent run recorded when it began (`parent`: None for a new sweep). The default name follows the data
    now (calibrated-<dataset>); a sweep begun under the old default, calibrated-classifier, keeps it on --resume
    instead of putting its champion into a second registered model."""
    if parent is None or not cfg.tracking.registered_model_is_default:
        return cfg.tracking.registered_model
    started = str(parent.data.params.get(PARAM_REGISTERED_MODEL) or "").strip()
    return started or cfg.tracking.registered_model


def check_store(cfg: SweepConfig, resume: bool, grow: bool = False) -> str | None:
    """Refuse to start a sweep whose name is taken (unless --resume); on --resume of a sweep that
    finished and registered its champion, return the line saying there is nothing to do, unless
    `grow` (a trial count was given) asks for more trials than it has.
    Reads only: a SQLite store that does not exist yet is not opened (that would create it)."""
    storage = cfg.storage_path or ""
    if not resume and storage and "://" not in storage:
        exp_dir = Path(storage) / cfg.name
        if (exp_dir / "tuner.pkl").exists():
            raise ConfigError(
                f"name: sweep {cfg.name!r} already exists ({exp_dir}); pass --resume to continue it "
                "or --name for a new one"
            )
    study_url = cfg.search.storage or "memory"
    if not resume and _study_exists(study_url, cfg.name):
        raise ConfigError(
            f"name: sweep {cfg.name!r} already exists (Optuna study in {redact(study_url)}); pass "
            "--resume to continue it or --name for a new one"
        )
    uri = cfg.tracking.uri or ""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file() or db.stat().st_size == 0:
            return None
    from mlflow.exceptions import MlflowException

    from sweeps.integrations.mlflow.store import MlflowStore

    store = MlflowStore(uri)
    try:
        experiment_id = store.experiment_id(cfg.tracking.experiment)
        if experiment_id is None:
            return None
        run = store.parent_run(experiment_id, cfg.name)
    except Exception as exc:  # MlflowException, or SQLAlchemy's own for a damaged SQLite file
        raise ConfigError(
            f"tracking.uri: cannot read the MLflow store at {redact(uri)}: {' '.join(str(exc).split())[:300]}"
        ) from None
    if run is None:
        return None
    if not resume:
        raise ConfigError(
            f"name: sweep {cfg.name!r} already exists (MLflow experiment {cfg.tracking.experiment!r}, "
            f"run {run.info.run_id}, {run.info.status}); pass --resume to continue it or --name "
            "for a new one"
        )
    tags = run.data.tags
    champion_run = tags.get(TAG_CHAMPION_RUN)
    if run.info.status != "FINISHED" or TAG_CHAMPION_TRIAL not in tags or not champion_run:
        return None
    model = started_registered_model(cfg, run)
    try:  # as sweeps.integrations.mlflow.model_export finds the versions registered from a run
        versions = store.versions_of_run(model, champion_run)
    except MlflowException:
        return None
    if not versions:
        return None  # selection ran but registration did not: resume registers the champion
    trials = sum(1 for r in store.trial_runs(experiment_id, cfg.name) if TAG_LOST_FROM_TUNE not in r.data.tags)
    if grow and cfg.search.num_samples > trials:  # grow it: the extra trials join the same study and parent run
        if (cfg.search.storage or "memory") == "memory":
            raise ConfigError(
                f"search.num_samples: growing sweep {cfg.name!r} from {trials} to {cfg.search.num_samples} trials "
                "needs its Optuna study in a database (search.storage); this one was kept in memory"
            )
        return None
    version = versions[-1]
    alias = " (alias champion)" if store.alias_version(model, CHAMPION_ALIAS) == str(version.version) else ""
    return (
        f"sweep {cfg.name!r} already finished with {trials} trial{'s' if trials != 1 else ''}: "
        f"champion trial {tags[TAG_CHAMPION_TRIAL]} is "
        f"registered as {model} version {version.version}{alias}; nothing to resume, nothing changed "
        f"(--num-samples above {trials} grows it)"
    )
