"""The Optuna study's PostgreSQL going away mid-sweep (issue #36, fault 1), in the container stack.

A local sweep (this virtualenv, a SQLite MLflow store in its folder) keeps its study in the stack's PostgreSQL
through the published port, as a driver outside the cluster would (`kubectl port-forward`). The PostgreSQL
container is stopped while trials run and started again once the sweep has said it waits: the sweep must
finish with one line each way and the service's promises (one MLflow run per trial, all terminal, the study's
trials matching Tune's and their runs, the champion registered once, no process left). With a short
`search.storage_outage_timeout_s` and PostgreSQL kept down, the sweep stops in one `error:` line (exit 1), its
runs KILLED; PostgreSQL back, `--resume` completes it. PostgreSQL is running and answering again when each
test ends, and so is the stack's MLflow server (whose store is in the same PostgreSQL), for the other
container tests sharing the stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.containers.fixtures import built_images, stack  # noqa: F401
from tests.containers.fixtures import http as _http
from tests.containers.harness import podman
from tests.sweep_helpers import FAST, LAUNCH, launch, store, sweep_runs

pytestmark = pytest.mark.container

TRIALS = 3
DOWN_LINE = "unreachable; the sweep waits for it"
BACK_LINE = "is back after"
# each trial long enough (a few seconds per epoch here) that the database goes away while trials train
ARGS = [*FAST, "--set", "run.train.epochs=4", "--set", "run.data.num_samples=6000"]
ARGS += ["--num-samples", str(TRIALS), "--max-concurrent", "2"]


class Postgres:
    """The stack's PostgreSQL container, stopped and started again; `url` reaches it through its published port.
    Started again, it is answering, and so is the stack's MLflow server (its store is in the same PostgreSQL)."""

    def __init__(self, stack) -> None:
        self.name = next(n for n in stack.cluster.containers if n.startswith("postgres-0"))
        self.url = stack.optuna_url
        self.stack = stack

    def stop(self) -> None:
        podman("stop", "-t", "10", self.name, timeout=60)

    def start(self) -> None:
        podman("start", self.name, timeout=60)
        wait_answering(self.url)
        wait_mlflow_answering(self.stack)


def wait_mlflow_answering(stack, timeout: float = 120.0) -> None:
    """Until the stack's MLflow server answers two store reads in a row (the pooled connections PostgreSQL's
    restart dropped are replaced after a failed request or two): the other container tests share it."""
    url = f"{stack.url}/api/2.0/mlflow/experiments/search?max_results=1"
    deadline, good = time.monotonic() + timeout, 0
    while good < 2:
        try:
            status = _http(url, stack.auth)[0]
        except OSError:
            status = 0
        good = good + 1 if status == 200 else 0
        assert time.monotonic() < deadline, f"the stack's MLflow server does not answer after the restart ({status})"
        time.sleep(0.5)


def wait_answering(url: str, timeout: float = 120.0) -> None:
    """Until a connection to `url` runs a query (PostgreSQL accepts connections after its recovery)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(sqlalchemy.text("SELECT 1"))
                return
            except sqlalchemy.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
    finally:
        engine.dispose()


def driver(cwd: Path, url: str, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    """The sweep, its output (stdout and stderr) going to a file read while it runs."""
    out = cwd / f"{name}.out"
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCH), *ARGS, "--name", name, "--set", f"search.storage={url}", *extra],
        cwd=cwd,
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    return proc, out


def wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen, out: Path, timeout: float) -> float:
    """Poll `ready` until true (the seconds it took); fails when the sweep ended first or time ran out."""
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, f"the sweep ended before {what}: " + out.read_text()[-3000:]
        assert time.monotonic() - t0 < timeout, f"no {what} within {timeout:.0f} s: " + out.read_text()[-3000:]
        time.sleep(0.5)
    return time.monotonic() - t0


def study_trials(url: str, name: str) -> int:
    """How many trials the sweep's study has (0 before it exists, or while the database is away)."""
    import optuna

    try:
        return len(optuna.load_study(study_name=name, storage=url).trials)
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def driver_lines(text: str) -> list[str]:
    """The driver's own lines: not those Ray forwards from its workers (`(train_trial pid=...)`, maybe coloured),
    where Ray's shutdown of a trial's worker can print a SIGTERM traceback of its own."""
    return [ln for ln in text.splitlines() if not ln.lstrip("\x1b[0123456789;m").startswith("(")]


def sweep_processes(cwd: Path) -> list[str]:
    """Processes still running whose command line or working folder is under `cwd` (Ray's, the driver's)."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            where = os.readlink(d / "cwd")
        except OSError:
            continue
        if str(cwd) in cmd or where.startswith(str(cwd)):
            left.append(f"{d.name}: {cmd[:200]}")
    return left


def check_promises(cwd: Path, url: str, name: str) -> None:
    """One FINISHED run per trial under a FINISHED parent, the study's trials those of Tune (by id, run and
    state), the champion registered once, nothing of the sweep still running."""
    import optuna

    client = store(cwd)
    parents, children = sweep_runs(client, name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [p.info.status for p in parents]
    runs = {r.data.tags["calib.trial_id"]: r for r in children}
    assert len(children) == TRIALS == len(runs), sorted(runs)
    assert all(r.info.status == "FINISHED" for r in children), [(t, r.info.status) for t, r in runs.items()]
    trials = optuna.load_study(study_name=name, storage=url).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * TRIALS, [(t.number, t.state.name) for t in trials]
    assert {t.user_attrs["tune_trial_id"] for t in trials} == set(runs)
    for t in trials:
        assert t.user_attrs.get("mlflow_run_id") == runs[t.user_attrs["tune_trial_id"]].info.run_id, t.user_attrs
    versions = client.search_model_versions("name='calibrated-mnist1d'")
    assert len(versions) == 1, [(v.version, v.run_id) for v in versions]
    assert versions[0].run_id in {r.info.run_id for r in children}
    deadline = time.monotonic() + 30  # Ray's processes end within seconds of the driver
    while sweep_processes(cwd) and time.monotonic() < deadline:
        time.sleep(1)
    assert not sweep_processes(cwd), sweep_processes(cwd)


def run_restart(cwd: Path, db: Postgres, name: str) -> dict[str, float]:
    """PostgreSQL stopped while trials train, started again once the sweep says it waits; the sweep finishes."""
    proc, out = driver(cwd, db.url, name)
    timings: dict[str, float] = {}
    try:
        wait_for("study trial", lambda: study_trials(db.url, name) >= 1, proc, out, timeout=600)
        db.stop()
        t_down = time.monotonic()
        print(time.strftime("%H:%M:%S"), "PostgreSQL stopped", flush=True)
        timings["noticed_s"] = wait_for("waiting line", lambda: DOWN_LINE in out.read_text(), proc, out, 300)
        time.sleep(5)  # the sweep keeps waiting meanwhile
        db.start()
        timings["down_s"] = time.monotonic() - t_down
        print(time.strftime("%H:%M:%S"), "PostgreSQL answering again", flush=True)
        t_up = time.monotonic()
        proc.wait(timeout=900)
        text = out.read_text()
        lines = text.splitlines()
        assert proc.returncode == 0, text[-4000:]
        down = [ln for ln in lines if DOWN_LINE in ln]
        back = [ln for ln in lines if ln.startswith("Optuna study database") and BACK_LINE in ln]
        print("what the user saw:", *down, *back, sep="\n")
        assert len(down) == 1 and down[0].startswith("Optuna study database "), down
        assert "search.storage_outage_timeout_s" in down[0] and db.url.split("@")[-1] in down[0], down
        assert len(back) == 1, back
        assert not any("Traceback" in ln or ln.startswith("error:") for ln in driver_lines(text)), text[-4000:]
        password = db.url.split("://", 1)[1].split("@")[0].partition(":")[2]
        assert password and password not in text
        timings["back_line_s"] = float(back[0].split(BACK_LINE)[1].split()[0])  # from the first failed call
        timings["rest_of_sweep_s"] = time.monotonic() - t_up
        check_promises(cwd, db.url, name)
        return timings
    finally:
        kill(proc)


def run_limit_then_resume(cwd: Path, db: Postgres, name: str, limit_s: int = 15) -> dict[str, float]:
    """PostgreSQL down past `search.storage_outage_timeout_s`: one error line, exit 1, runs KILLED; back, --resume
    completes the sweep."""
    extra = ["--set", f"search.storage_outage_timeout_s={limit_s}"]
    proc, out = driver(cwd, db.url, name, *extra)
    timings: dict[str, float] = {}
    try:
        wait_for("study trial", lambda: study_trials(db.url, name) >= 1, proc, out, timeout=600)
        db.stop()
        t_down = time.monotonic()
        proc.wait(timeout=600)
        timings["exit_after_stop_s"] = time.monotonic() - t_down
    finally:
        kill(proc)
        if proc.returncode != 1:
            db.start()
    text = out.read_text()
    lines = text.splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    print("what the user saw:", *[ln for ln in lines if "Optuna study database" in ln], sep="\n")
    try:
        assert proc.returncode == 1, text[-4000:]
        assert len(errors) == 1, text[-4000:]
        assert f"search.storage_outage_timeout_s={limit_s}" in errors[0] and "continue it with --resume" in errors[0]
        assert sum(DOWN_LINE in ln for ln in lines) == 1, text[-4000:]
        assert not any("Traceback" in ln for ln in driver_lines(text)), text[-4000:]
        parents, children = sweep_runs(store(cwd), name)
        assert [p.info.status for p in parents] == ["KILLED"]
        assert all(r.info.status in ("KILLED", "FINISHED") for r in children), [r.info.status for r in children]
    finally:
        db.start()
    t0 = time.monotonic()
    proc2 = launch(cwd, *ARGS, "--name", name, "--set", f"search.storage={db.url}", *extra, "--resume", timeout=900)
    timings["resume_s"] = time.monotonic() - t0
    assert proc2.returncode == 0, (proc2.stdout + proc2.stderr)[-4000:]
    assert not any("Traceback" in ln for ln in driver_lines(proc2.stdout + proc2.stderr)), proc2.stdout[-4000:]
    check_promises(cwd, db.url, name)
    return timings


def test_a_restarted_study_database_is_waited_out(stack, tmp_path):
    db = Postgres(stack)
    try:
        timings = run_restart(tmp_path, db, f"pg-restart-{uuid.uuid4().hex[:6]}")
        print("timings:", timings)
        (stack.logs / "study-outage-restart.txt").write_text(f"{timings}\n")
    finally:
        db.start()  # running and answering for the other tests, whatever happened here


def test_a_study_database_down_past_the_limit_stops_the_sweep_and_resume_completes_it(stack, tmp_path):
    db = Postgres(stack)
    try:
        timings = run_limit_then_resume(tmp_path, db, f"pg-limit-{uuid.uuid4().hex[:6]}")
        print("timings:", timings)
        (stack.logs / "study-outage-limit.txt").write_text(f"{timings}\n")
    finally:
        db.start()
