"""Start-up's steps and the stop between them (issue 47 item 2; sweeps/start_steps.py), fast: no Ray, no sweep.

A stop signal is raised at once outside held sections, as the held section ends inside one (a second signal at
once), and again at the next step when something swallowed it; the steps are timed and traced; launch.py's
first import loads nothing heavy, and a process that inherits SIGINT ignored still stops on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps import service_start
from sweeps.start_steps import STEP_NAMES, TRACE_ENV, Startup, StopSignals
from tests.paths import ROOT


@pytest.fixture
def signals():
    """A StopSignals taking SIGINT and SIGTERM for the test; the handlers from before after it."""
    s = StopSignals()
    with s.installed():
        yield s


def _signal(signum: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # Python runs the handler at the next bytecode; give the kernel its moment


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_outside_held_sections_is_raised_at_once(signals, signum):
    with pytest.raises(KeyboardInterrupt):
        _signal(signum)
        time.sleep(5)  # not reached
    assert signals.requested and signals.signum == signum


def test_a_stop_inside_a_held_section_is_raised_as_it_ends(signals):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals.held():
            _signal()
            reached.append("rest of the section")
        reached.append("after it")  # not reached
    assert reached == ["rest of the section"]


def test_a_second_stop_inside_a_held_section_is_raised_at_once(signals):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals.held():
            _signal()
            reached.append("first deferred")
            _signal()
            reached.append("not reached")
    assert reached == ["first deferred"] and signals.count == 2


def test_a_held_section_that_fails_raises_its_own_error(signals):
    with pytest.raises(RuntimeError):
        with signals.held():
            _signal()
            raise RuntimeError("ray.init failed")
    with pytest.raises(KeyboardInterrupt):  # the stop is still requested: the next step raises it
        with Startup(signals).step("study"):
            pass


def test_a_swallowed_stop_is_raised_again_between_steps(signals, tmp_path, monkeypatch):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "trace"))
    startup = Startup(signals)
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with startup.step("config"):
            try:  # a library that catches everything (a bare except around an optional import, say)
                _signal()
            except BaseException:  # noqa: BLE001
                ran.append("swallowed")
        ran.append("not reached: the step's end raises it")
    assert ran == ["swallowed"]
    with pytest.raises(KeyboardInterrupt):  # and before the next step begins
        with startup.step("checks"):
            ran.append("not reached")
    assert ran == ["swallowed"]
    events = [line.split(" ", 1)[1] for line in (tmp_path / "trace").read_text().splitlines()]
    assert events[:2] == ["begin config", "signal SIGINT in config"] and events[2].startswith("end config ")
    assert len(events) == 3  # the next step never began
    signals.clear()
    with startup.step("checks"):  # a cleared stop is gone
        ran.append("checks")
    assert ran == ["swallowed", "checks"] and not signals.requested


def test_a_thread_finishes_its_step(signals):
    """Only the main thread raises the stop: a step in a thread (the MLflow store beside Ray's start) ends."""
    import threading

    startup, done = Startup(signals), []
    signals.count = 1  # a stop already requested
    t = threading.Thread(target=lambda: done.append(startup.run("store", lambda: "opened")))
    t.start()
    t.join()
    assert done == ["opened"] and "store" in startup.ended
    with pytest.raises(KeyboardInterrupt):
        startup.done()


def test_steps_are_timed_traced_and_itemised(signals, tmp_path, monkeypatch):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "trace"))
    startup = Startup(signals)
    for name in ("config", "checks", "lock", "ray_start", "store", "study", "tuner"):
        with startup.step(name):
            time.sleep(0.01)
    startup.done()
    secs = startup.seconds()
    assert list(secs) == [n for n in STEP_NAMES if n != "imports"] and all(s >= 0.01 for s in secs.values())
    line = startup.line()
    assert line.startswith("Start-up: ") and "s before the first trial: config " in line
    assert "Ray " in line and "(MLflow " in line and "s beside it, " in line and "s of it waited for)" in line
    timings = startup.timings()
    assert timings["startup_s"] >= sum(secs.values()) - 1e-6 and timings["startup_ray_start_s"] == secs["ray_start"]
    events = [line.split()[1:3] for line in (tmp_path / "trace").read_text().splitlines()]
    assert events[:2] == [["begin", "config"], ["end", "config"]] and events[-1] == ["begin", "trials"]
    with pytest.raises(ValueError, match="unknown start-up step"):
        with startup.step("warm-up"):
            pass


def test_launch_takes_the_signals_before_anything_heavy_is_imported():
    """launch.py's first import (sweeps.start_steps) loads the standard library only: a Ctrl+C during the
    seconds of imports that follow is the sweep's, not lost and not a traceback."""
    heavy = "('pydantic', 'numpy', 'ray', 'mlflow', 'sweeps.api')"
    code = f"import sys, sweeps.start_steps; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_launch_that_inherits_sigint_ignored_still_stops_on_it(tmp_path):
    """The lost Ctrl+C: a sweep started in the background of a shell script inherits SIGINT ignored, and Python
    then installs no handler; the sweep ignored SIGINT until Ray Tune's fit took it over. The launch's handler is
    installed whatever it inherits: SIGINT during the imports stops it with 130 and one line."""
    trace = tmp_path / "trace"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "sweeps" / "launch.py"), "--dry-run"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, TRACE_ENV: str(trace)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.time() + 60
        while not (trace.exists() and "begin imports" in trace.read_text()) and time.time() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = trace.read_text()
    assert proc.returncode == 130, (out, err, events)
    assert err.strip().splitlines()[-1].startswith("interrupted"), err
    assert "Traceback" not in err and "signal SIGINT in " in events, (err, events)


def test_a_stop_during_ray_start_leaves_the_parent_run_killed(tmp_path, monkeypatch):
    """A stop during Ray's start is held until Ray is up and recorded; then raised, it leaves the parent run the
    MLflow thread opened beside it KILLED (no Ray here: connect_ray sends the signal and returns)."""
    from sweeps import service
    from sweeps.api import resolve
    from sweeps.contract import ROLE_PARENT, TAG_ROLE
    from sweeps.integrations.mlflow.store import MlflowStore
    from sweeps.start_steps import SIGNALS

    cfg = resolve(None, ["name=held", "search.num_samples=2"], workdir=tmp_path)
    after_signal = []

    def ray_start_stopped(cluster, plugins):
        _signal()
        after_signal.append("Ray's start went on")
        return None

    monkeypatch.setattr(service_start, "connect_ray", ray_start_stopped)
    startup = Startup()
    try:
        with pytest.raises(KeyboardInterrupt):
            service.execute(cfg, cluster=False, resume=False, startup=startup)
    finally:
        SIGNALS.clear()
    assert after_signal == ["Ray's start went on"]
    assert "store" in startup.ended and "ray_start" not in startup.ended
    store = MlflowStore(cfg.tracking.uri or "")
    exp = store.client.get_experiment_by_name(cfg.tracking.experiment)
    runs = store.client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_PARENT}'")
    assert [r.info.status for r in runs] == ["KILLED"]


def test_ray_init_keeps_the_drivers_handlers(monkeypatch):
    """Ray's init puts sys.exit(15) in place for SIGTERM (and its core worker a C-level handler): inside
    stop_handlers_kept the first is never set and the driver's handlers are installed again after."""
    from ray._private import utils as ray_utils

    from sweeps.integrations.ray.session import stop_handlers_kept

    def mine(signum, frame):
        raise KeyboardInterrupt

    def ray_exit(signum, frame):
        sys.exit(signum)

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with stop_handlers_kept():
            ray_utils.set_sigterm_handler(ray_exit)  # what ray.init does first
            assert signal.getsignal(signal.SIGTERM) is mine
            signal.signal(signal.SIGTERM, ray_exit)  # and anything else that replaces it meanwhile
        assert signal.getsignal(signal.SIGTERM) is mine
        assert ray_utils.set_sigterm_handler.__name__ == "set_sigterm_handler"
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_trace_needs_no_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(TRACE_ENV, raising=False)
    startup = Startup(StopSignals())
    with startup.step("config"):
        pass
    assert "config" in startup.seconds() and not any(Path(tmp_path).iterdir())


def test_a_tuner_stopped_before_its_fit_is_made_again_on_resume(tmp_path):
    """A stop at the end of start-up can leave Tune's Tuner file without a snapshot of its state; Tune's restore
    of that fails at fit ("no experiment state file"), so --resume makes a new Tuner there."""
    from sweeps.integrations.ray.tuner import restorable

    exp = tmp_path / "sweep"
    assert not restorable(str(exp))
    exp.mkdir()
    (exp / "tuner.pkl").write_bytes(b"made, never fitted")
    assert not restorable(str(exp))
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    assert restorable(str(exp))


@pytest.mark.parametrize("resume", [False, True])
def test_the_cli_says_what_a_stop_in_the_checks_left(tmp_path, monkeypatch, capsys, resume):
    """A stop before the parent run exists: exit 130 and one line, 'nothing was written' (a --resume: the sweep
    as it was, and how to continue it); the handlers from before are back after main."""
    from sweeps import cli, startup

    def stopped(*args, **kwargs):
        _signal()
        raise AssertionError("not reached")

    monkeypatch.setattr(startup, "preflight", stopped)
    monkeypatch.chdir(tmp_path)
    before = signal.getsignal(signal.SIGINT)
    assert cli.main(["--name", "stopped", *(["--resume"] if resume else [])]) == 130
    assert signal.getsignal(signal.SIGINT) is before
    err = capsys.readouterr().err.strip().splitlines()
    if resume:
        assert err == ["interrupted before the sweep continued; nothing was changed; continue with --resume"]
    else:
        assert err == ["interrupted before the sweep started; nothing was written"]
    assert not (tmp_path / "mlflow.db").exists()
