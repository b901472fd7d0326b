"""The Optuna study's database going away: the storage's outage policy with a fake clock (fast).

Storage calls fail with real driver errors (psycopg's refused connection, wrapped by SQLAlchemy and by Optuna
as they are when PostgreSQL is down) a few times, then work: one line each way, the results unchanged; other
errors are raised at once; past `search.storage_outage_timeout_s` one line naming the field. The searcher keeps
what it could not write past the limit and writes it on --resume.
"""

from __future__ import annotations

import pickle

import optuna
import pytest
import sqlalchemy
from optuna.storages import RDBStorage
from sqlalchemy.exc import OperationalError

from sweeps.integrations.optuna import storage as storage_mod
from sweeps.integrations.optuna.storage import (
    RetryingRDBStorage,
    StorageUnavailable,
    is_storage_outage,
    make_rdb_storage,
)
from sweeps.outage import MAX_WAIT_S, OutageWaitStopped


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def refused() -> OperationalError:
    """The error SQLAlchemy raises when nothing listens where PostgreSQL should (a real psycopg connection)."""
    engine = sqlalchemy.create_engine("postgresql+psycopg://optuna:secret@127.0.0.1:1/optuna")
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError("a connection to port 1 was accepted")


def as_optuna_raises(exc: BaseException) -> optuna.exceptions.StorageInternalError:
    """`exc` as Optuna's RDBStorage raises it from a session (StorageInternalError, the driver's error its cause)."""
    try:
        try:
            raise exc
        except sqlalchemy.exc.SQLAlchemyError as inner:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from inner
    except optuna.exceptions.StorageInternalError as outer:
        return outer


def flaky(monkeypatch: pytest.MonkeyPatch, name: str, down: int, error: BaseException) -> list[int]:
    """RDBStorage.<name> fails `down` times with `error`, then works; returns the call counter."""
    plain = getattr(RDBStorage, name)
    calls = [0]

    def method(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] <= down:
            raise error
        return plain(self, *args, **kwargs)

    monkeypatch.setattr(RDBStorage, name, method)
    return calls


def make(tmp_path, limit: float = 600.0) -> tuple[RetryingRDBStorage, Clock, list[str]]:
    lines: list[str] = []
    storage = make_rdb_storage(f"sqlite:///{tmp_path}/optuna.db", limit)
    clock = Clock()
    retry = storage.retry
    assert retry is not None
    retry.say, retry.sleep, retry.clock = lines.append, clock.sleep, clock
    return storage, clock, lines


def study_searcher(url: str, sweep: str):
    """The sweep's Optuna searcher on a study database at `url` (a waiting storage, 600 s limit)."""
    from ray import tune

    from sweeps.integrations.optuna.study import SweepSearch

    return SweepSearch(
        space={"lr": tune.loguniform(1e-3, 1e-1)},
        metric=["val_accuracy", "val_ece"],
        mode=["max", "min"],
        seed=0,
        study_name=sweep,
        storage=make_rdb_storage(url, 600),
        sweep=sweep,
    )


def test_short_outage_waits_says_one_line_each_way_and_returns_the_same(tmp_path, monkeypatch, refused):
    storage, clock, lines = make(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage, directions=["maximize", "minimize"])
    trial = study.ask()
    calls = flaky(monkeypatch, "set_trial_user_attr", 5, as_optuna_raises(refused))
    trial.set_user_attr("tune_trial_id", "abc_00001")  # through Optuna's cache, as the searcher does
    assert calls[0] == 6
    assert clock.sleeps == [1, 2, 4, 8, MAX_WAIT_S] and MAX_WAIT_S == 10
    assert len(lines) == 2, lines  # one when it went, one when it came back, none per retry
    assert lines[0].startswith("Optuna study database sqlite:///") and "unreachable; the sweep waits for it" in lines[0]
    assert "up to 600 s: search.storage_outage_timeout_s" in lines[0]
    assert lines[1] == "Optuna study database is back after 25 s; the sweep goes on"
    monkeypatch.undo()
    loaded = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert loaded.trials[0].user_attrs == {"tune_trial_id": "abc_00001"}  # written once, unchanged
    # a second outage is announced again; a read returns what it would have returned
    flaky(monkeypatch, "get_trial", 1, refused)  # the raw SQLAlchemy error (raised outside a session) too
    assert storage.get_trial(trial._trial_id).user_attrs == {"tune_trial_id": "abc_00001"}
    assert len(lines) == 4 and "back after 1 s" in lines[3]


def test_a_restarted_server_dropping_the_connection_is_an_outage(tmp_path, monkeypatch):
    storage, clock, lines = make(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage)
    dropped = OperationalError(
        "SELECT studies.study_id", {}, Exception("terminating connection due to administrator command")
    )
    flaky(monkeypatch, "set_study_user_attr", 2, as_optuna_raises(dropped))
    study.set_user_attr("champion_trial_number", 3)
    assert clock.sleeps == [1, 2] and len(lines) == 2
    assert study.user_attrs == {"champion_trial_number": 3}


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("UPDATE trials", {}, Exception("database is locked")),
        optuna.exceptions.StorageInternalError("An exception is raised during the commit."),
        KeyError("No study with name 'x'"),
        ValueError("bad value"),
    ],
    ids=["locked", "internal-without-connection-cause", "missing", "value"],
)
def test_errors_that_are_not_outages_are_raised_at_once(tmp_path, monkeypatch, error):
    storage, clock, lines = make(tmp_path)
    optuna.create_study(study_name="s", storage=storage)
    flaky(monkeypatch, "get_study_id_from_name", 1, error)
    with pytest.raises(type(error)):
        storage.get_study_id_from_name("s")
    assert clock.sleeps == [] and lines == []


def test_outage_past_the_limit_stops_with_one_line_naming_the_field(tmp_path, monkeypatch, refused):
    storage, clock, lines = make(tmp_path, limit=15)
    optuna.create_study(study_name="s", storage=storage)
    flaky(monkeypatch, "get_study_id_from_name", 10**6, as_optuna_raises(refused))
    with pytest.raises(StorageUnavailable) as info:
        storage.get_study_id_from_name("s")
    msg = str(info.value)
    assert "\n" not in msg and "search.storage_outage_timeout_s=15" in msg and "continue it with --resume" in msg
    assert msg.startswith("Optuna study database sqlite:///") and "unreachable for 15 s, past" in msg
    assert sum(clock.sleeps) == pytest.approx(15)  # the last wait is cut to the limit
    assert len(lines) == 1
    n = len(clock.sleeps)  # later calls of the same outage fail at once, without waiting again
    with pytest.raises(StorageUnavailable):
        storage.get_study_id_from_name("s")
    assert len(clock.sleeps) == n


def test_the_database_password_is_not_shown(tmp_path, refused):
    storage, _, _ = make(tmp_path)
    retry = storage._policy("postgresql+psycopg://optuna:s3cret@db:5432/optuna")
    assert retry is not None
    lines: list[str] = []
    clock = Clock()
    retry.say, retry.sleep, retry.clock, retry.limit_s = lines.append, clock.sleep, clock, 3

    def down():
        raise refused

    with pytest.raises(StorageUnavailable) as info:
        retry.call(down)
    assert "s3cret" not in lines[0] + str(info.value)
    assert "postgresql+psycopg://optuna:***@db:5432/optuna" in lines[0]


def test_a_stop_ends_the_wait_at_once(tmp_path, monkeypatch, refused):
    storage, clock, lines = make(tmp_path)
    optuna.create_study(study_name="s", storage=storage)
    asked = []
    storage.configure(600, give_up=lambda: len(asked) > 2 or asked.append(1) is not None)
    retry = storage.retry
    assert retry is not None
    retry.say, retry.sleep, retry.clock = lines.append, clock.sleep, clock
    flaky(monkeypatch, "get_study_id_from_name", 10**6, refused)
    with pytest.raises(OutageWaitStopped):
        storage.get_study_id_from_name("s")
    assert sum(clock.sleeps) < 3 and len(lines) == 1


def test_classification(refused):
    assert is_storage_outage(refused)
    assert is_storage_outage(as_optuna_raises(refused))
    assert "connection" in str(refused).lower() and "refused" in str(refused).lower()
    assert is_storage_outage(ConnectionResetError())
    assert not is_storage_outage(StorageUnavailable("x"))
    assert not is_storage_outage(ValueError("connection refused"))  # words alone are not a database's error


def test_pickles_with_its_limit_and_checks_pooled_connections(tmp_path, monkeypatch):
    storage, _, _ = make(tmp_path, limit=42)
    again = pickle.loads(pickle.dumps(storage))
    assert again.outage_timeout_s == 42 and again.retry is not None and again.retry.limit_s == 42
    assert again.retry.field == "search.storage_outage_timeout_s"
    assert make_rdb_storage(f"sqlite:///{tmp_path}/other.db").retry is None  # checks and reports: no waiting
    seen = {}

    class Fake:
        def __init__(self, url, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(storage_mod, "RetryingRDBStorage", Fake)
    make_rdb_storage("postgresql+psycopg://optuna:pw@db/optuna", 600)
    assert seen["engine_kwargs"] == {"pool_pre_ping": True} and seen["outage_timeout_s"] == 600


def test_searcher_keeps_what_it_could_not_write_and_writes_it_on_resume(tmp_path, monkeypatch, refused):
    """Past the limit the completion is kept (not lost, the trial not failed), the guard ends the fit; --resume
    writes it: the study trial ends COMPLETE with its values and MLflow run id."""

    from sweeps.integrations.optuna.study import StudyOutageGuard, SweepSearch

    url = f"sqlite:///{tmp_path}/optuna.db"
    guard = StudyOutageGuard("outage-sweep", 5)
    try:
        searcher = study_searcher(url, "outage-sweep")
        retry = searcher._storage.retry
        assert retry is not None and retry.limit_s == 5  # the guard's limit, this process's setting
        clock, lines = Clock(), []
        retry.say, retry.sleep, retry.clock = lines.append, clock.sleep, clock
        assert searcher.suggest("t1") is not None
        from sweeps import run_notes

        run_notes._RUN_IDS[("outage-sweep", "t1")] = "run-1"
        flaky(monkeypatch, "get_trial", 10**6, refused)
        searcher.on_trial_complete("t1", result={"val_accuracy": 0.9, "val_ece": 0.05})
        assert isinstance(guard.outage, StorageUnavailable)
        assert "t1" not in searcher._completed_trials and searcher._owed[0][:2] == ("complete", "t1")
        with pytest.raises(StorageUnavailable):
            guard.on_step_begin(iteration=1, trials=[])
        searcher.save(str(tmp_path / "searcher.pkl"))
        monkeypatch.undo()
        run_notes._RUN_IDS.clear()  # a new driver process: the run is not noted there
    finally:
        guard.close()
    guard = StudyOutageGuard("outage-sweep", 600)
    try:
        resumed = SweepSearch(metric=["val_accuracy", "val_ece"], mode=["max", "min"], sweep="outage-sweep")
        resumed.restore(str(tmp_path / "searcher.pkl"))
        assert resumed._owed == [] and "t1" in resumed._completed_trials
    finally:
        guard.close()
    (frozen,) = optuna.load_study(study_name="outage-sweep", storage=url).trials
    assert frozen.state == optuna.trial.TrialState.COMPLETE and frozen.values == [0.9, 0.05]
    assert frozen.user_attrs["tune_trial_id"] == "t1" and frozen.user_attrs["mlflow_run_id"] == "run-1"


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_storage_outage_timeout_is_validated_in_one_line(value):
    from calib_core.config import ConfigError
    from sweeps.config import load_sweep_config

    with pytest.raises(ConfigError) as info:
        load_sweep_config(None, [f"search.storage_outage_timeout_s={value}"])
    assert "search.storage_outage_timeout_s" in str(info.value) and "\n" not in str(info.value)
    assert load_sweep_config(None, []).search.storage_outage_timeout_s == 600


def test_a_run_noted_while_the_database_is_away_still_reaches_its_study_trial(tmp_path, monkeypatch):
    """The tracking writer notes trial runs; the study trial's write of one may wait out an outage. That wait
    must not hold up the noting of later runs: a trial completing after the database is back finds its run
    (the container test once lost `mlflow_run_id` this way, the writer queued behind the waiting write)."""
    import threading
    import time

    from sweeps import run_notes

    url = f"sqlite:///{tmp_path}/optuna.db"
    searcher = study_searcher(url, "late-runs")
    try:
        assert searcher.suggest("t1") is not None and searcher.suggest("t2") is not None
        back = threading.Event()
        real = RetryingRDBStorage.set_trial_user_attr

        def away_until_back(self, *args, **kwargs):
            assert back.wait(30), "the database never came back"
            return real(self, *args, **kwargs)

        monkeypatch.setattr(RetryingRDBStorage, "set_trial_user_attr", away_until_back)
        start = time.monotonic()
        run_notes.note_run("late-runs", "t1", "run-1")  # its study write waits for the database
        run_notes.note_run("late-runs", "t2", "run-2")
        assert time.monotonic() - start < 1.0, "noting a run waited on the study database"
        assert run_notes.noted_run("late-runs", "t2") == "run-2"
        back.set()
        searcher.on_trial_complete("t2", result={"val_accuracy": 0.9, "val_ece": 0.05})
        searcher.on_trial_complete("t1", result={"val_accuracy": 0.8, "val_ece": 0.07})
        assert run_notes.listeners_told(10)
    finally:
        run_notes._RUN_LISTENERS.pop("late-runs", None)
        for key in [k for k in run_notes._RUN_IDS if k[0] == "late-runs"]:
            run_notes._RUN_IDS.pop(key)
    trials = optuna.load_study(study_name="late-runs", storage=url).trials
    assert {t.user_attrs["tune_trial_id"]: t.user_attrs.get("mlflow_run_id") for t in trials} == {
        "t1": "run-1",
        "t2": "run-2",
    }
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]


def _lr_by_run(trial) -> None:
    """A define-by-run space (the sweep's own SearchSpace is one): its parameters written after Optuna's ask."""
    trial.suggest_float("lr", 1e-3, 1e-1, log=True)


@pytest.mark.parametrize("space", ["define-by-run", "fixed distributions"])
def test_a_suggestion_cut_short_by_an_outage_is_taken_over_on_resume(tmp_path, monkeypatch, refused, space):
    """The database goes away while a trial's parameters are written (after Optuna's ask wrote the study trial, or
    inside it): Tune gets no trial, the fit ends; on --resume that study trial goes back to Optuna's queue and the
    next Tune trial takes it over, so the study holds exactly Tune's trials, all COMPLETE (a container test once
    found it left RUNNING beside a fourth trial)."""
    from ray import tune

    from sweeps.integrations.optuna.study import StudyOutageGuard, SweepSearch

    url, pkl = f"sqlite:///{tmp_path}/optuna.db", str(tmp_path / "searcher.pkl")
    metric, mode = ["val_accuracy", "val_ece"], ["max", "min"]
    guard = StudyOutageGuard("cut", 5)
    try:
        searcher = SweepSearch(
            space=_lr_by_run if space == "define-by-run" else {"lr": tune.loguniform(1e-3, 1e-1)},
            metric=metric,
            mode=mode,
            seed=0,
            study_name="cut",
            storage=make_rdb_storage(url, 600),
            sweep="cut",
        )
        retry = searcher._storage.retry
        clock = Clock()
        retry.say, retry.sleep, retry.clock = (lambda _: None), clock.sleep, clock
        assert searcher.suggest("t1") is not None
        flaky(monkeypatch, "_set_trial_param", 10**6, refused)  # what Optuna's cache calls on its backend
        with pytest.raises(StorageUnavailable):  # the fit ends now (Tune would wait 600 s for a suggestion)
            searcher.suggest("t2")
        assert isinstance(guard.outage, StorageUnavailable)
        searcher.save(pkl)
        monkeypatch.undo()
    finally:
        guard.close()
    states = [t.state.name for t in optuna.load_study(study_name="cut", storage=url).trials]
    assert states == ["RUNNING", "RUNNING"]  # t1 training; the cut one open, its parameter unwritten
    guard = StudyOutageGuard("cut", 600)
    try:
        resumed = SweepSearch(metric=metric, mode=mode, sweep="cut")
        resumed.restore(pkl)
        states = [t.state.name for t in optuna.load_study(study_name="cut", storage=url).trials]
        assert states == ["RUNNING", "WAITING"]
        params = resumed.suggest("t3")
        assert params is not None
        resumed.on_trial_complete("t1", result={"val_accuracy": 0.9, "val_ece": 0.05})
        resumed.on_trial_complete("t3", result={"val_accuracy": 0.8, "val_ece": 0.07})
    finally:
        guard.close()
    trials = optuna.load_study(study_name="cut", storage=url).trials
    assert [(t.number, t.state.name, t.user_attrs["tune_trial_id"]) for t in trials] == [
        (0, "COMPLETE", "t1"),
        (1, "COMPLETE", "t3"),
    ]
    assert trials[1].params == params


def test_a_trial_lost_with_a_killed_driver_is_taken_over_by_its_replacement(tmp_path):
    """No outage: a study trial handed out after Tune's last snapshot (the driver killed) goes back to Optuna's
    queue on resume, and the replacement Tune samples takes it over with its parameters."""
    from sweeps.integrations.optuna.study import SweepSearch

    url, pkl = f"sqlite:///{tmp_path}/optuna.db", str(tmp_path / "searcher.pkl")
    searcher = study_searcher(url, "killed")
    assert searcher.suggest("t1") is not None
    searcher.save(pkl)  # Tune's last snapshot
    lost = searcher.suggest("t2")  # after it: lost with the driver
    resumed = SweepSearch(metric=["val_accuracy", "val_ece"], mode=["max", "min"], sweep="killed")
    resumed.restore(pkl)
    trials = optuna.load_study(study_name="killed", storage=url).trials
    assert [t.state.name for t in trials] == ["RUNNING", "WAITING"] and "requeued" in trials[1].user_attrs
    assert resumed.suggest("t3") == lost
    resumed.on_trial_complete("t3", result={"val_accuracy": 0.8, "val_ece": 0.07})
    trials = optuna.load_study(study_name="killed", storage=url).trials
    assert [(t.state.name, t.user_attrs["tune_trial_id"]) for t in trials] == [("RUNNING", "t1"), ("COMPLETE", "t3")]


def test_a_resume_with_no_saved_searcher_state_takes_over_the_open_trials(tmp_path):
    """The sweep stopped before Ray Tune saved any searcher state (the database went away during the first
    suggestion): the resumed searcher is the one pickled at the start, never restored. Its first suggestion still
    hands the open study trial to the next Tune trial (the reference arm, trial 0, is not lost)."""
    import pickle

    url = f"sqlite:///{tmp_path}/optuna.db"
    searcher = study_searcher(url, "unsaved")
    pickled = pickle.dumps(searcher)  # as tuner.pkl holds it
    searcher._ot_study.ask()  # the first suggestion's study trial, cut short before Tune made a trial of it
    resumed = pickle.loads(pickled)  # a new driver process
    from sweeps.integrations.optuna import study as study_mod

    resumed.__dict__["_reconciled_in"] = "an earlier process"
    assert study_mod._PROCESS != "an earlier process"
    params = resumed.suggest("t1")
    resumed.on_trial_complete("t1", result={"val_accuracy": 0.9, "val_ece": 0.05})
    trials = optuna.load_study(study_name="unsaved", storage=url).trials
    assert [(t.number, t.state.name, t.user_attrs.get("tune_trial_id")) for t in trials] == [(0, "COMPLETE", "t1")]
    assert params is not None and "requeued" in trials[0].user_attrs
