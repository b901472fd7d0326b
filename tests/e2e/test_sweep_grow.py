"""Growing a finished sweep (issue #24 item 3): `--resume --num-samples N` with N above the finished count
runs the extra trials in the same Optuna study and MLflow parent run, then selects again; N at or below
the count, or `--resume` without a count, says in one line that there is nothing to add."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.sweep_helpers import FAST, launch, store, sweep_runs

pytestmark = pytest.mark.slow

NAME = "grow"


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("grow")
    first = launch(d, "--num-samples", "2", "--name", NAME, "--seed", "3", *FAST)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    client = store(d)
    (parent0,), children0 = sweep_runs(client, NAME)
    same = launch(d, "--resume", "--num-samples", "2", "--name", NAME, "--seed", "3", *FAST)
    plain = launch(d, "--resume", "--name", NAME, "--seed", "3", *FAST)
    grow = launch(d, "--resume", "--num-samples", "3", "--name", NAME, "--seed", "3", *FAST)
    assert grow.returncode == 0, grow.stdout[-3000:] + grow.stderr[-3000:]
    return {
        "dir": d,
        "first": first,
        "same": same,
        "plain": plain,
        "grow": grow,
        "parent0": parent0,
        "children0": children0,
    }


def test_nothing_to_add_is_one_line_and_changes_nothing(grown):
    for key in ("same", "plain"):
        proc = grown[key]
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, proc.stdout
        assert "already finished with 2 trials" in lines[0] and "nothing changed" in lines[0], lines[0]
        assert "--num-samples above 2 grows it" in lines[0]


def test_growth_adds_trials_to_the_same_parent_and_study(grown):
    client = store(grown["dir"])
    (parent,), children = sweep_runs(client, NAME)
    assert parent.info.run_id == grown["parent0"].info.run_id  # the same parent run
    assert parent.info.status == "FINISHED"
    assert parent.data.tags.get("calib.grown_to") == "3"
    assert len(children) == 3, [c.data.tags.get("calib.trial_id") for c in children]
    old = {c.info.run_id for c in grown["children0"]}
    assert old <= {c.info.run_id for c in children}  # the first trials' runs are kept, not re-run
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.tags.get("mlflow.parentRunId") == parent.info.run_id for c in children)

    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{grown['dir']}/optuna.db")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    # the grown sampler is seeded apart from the first one: no configuration drawn twice
    assert len({tuple(sorted(t.params.items())) for t in done}) == 3
    tune_ids = {t.user_attrs.get("tune_trial_id") for t in done}
    assert tune_ids == {c.data.tags["calib.trial_id"] for c in children}


def test_growth_reselects_over_every_trial_and_says_so(grown):
    out = grown["grow"].stdout
    assert "Growing 'grow' from 2 to 3 trials" in out, out[-3000:]
    assert "[3/3 trials done" in out, out[-3000:]
    client = store(grown["dir"])
    (parent,), children = sweep_runs(client, NAME)
    champion = parent.data.tags["calib.champion_trial"]
    assert champion in {c.data.tags["calib.trial_id"] for c in children}
    # the champion's version is registered; a resume that adds nothing now reports 3 trials
    again = launch(grown["dir"], "--resume", "--num-samples", "3", "--name", NAME, "--seed", "3", *FAST)
    assert again.returncode == 0 and "already finished with 3 trials" in again.stdout, again.stdout + again.stderr
    assert Path(grown["dir"], "ray_results", f"{NAME}.grow3").is_dir()
