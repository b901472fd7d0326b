"""The trials as selection sees them: every Tune result matched to its MLflow run in one query (real SQLite
store), a trial without a run kept with none, and a store edited by hand (two runs of one trial) refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweeps.contract import ROLE_PARENT, ROLE_TRIAL, TAG_ROLE, TAG_SWEEP, TAG_TRIAL
from sweeps.finish import trial_records
from sweeps.integrations.mlflow.store import MlflowStore


def _result(tid: str, **metrics) -> SimpleNamespace:
    return SimpleNamespace(
        metrics={"trial_id": tid, "status": "completed", "val_ece": 0.1, "val_accuracy": 0.9, **metrics},
        path=f"/x/trial_{tid}",
        error=None,
        checkpoint=None,
        config={"calibrator": "temperature"},
    )


def test_results_are_matched_to_their_runs(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = store.ensure_experiment("e")
    store.create_run(exp, "p", {TAG_SWEEP: "s", TAG_ROLE: ROLE_PARENT})
    ids = {t: store.create_run(exp, t, {TAG_SWEEP: "s", TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: t}) for t in ("a1", "b2")}
    store.create_run(exp, "other", {TAG_SWEEP: "other-sweep", TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: "c3"})
    recs = trial_records([_result("a1"), _result("b2"), _result("c3")], store, exp, "s")
    assert [(r.trial_id, r.run_id) for r in recs] == [("a1", ids["a1"]), ("b2", ids["b2"]), ("c3", None)]
    assert recs[0].metrics == {"val_ece": 0.1, "val_accuracy": 0.9}
    store.create_run(exp, "a1 again", {TAG_SWEEP: "s", TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: "a1"})
    with pytest.raises(RuntimeError, match="more than one MLflow run has tags .*'a1'.*edited by hand"):
        trial_records([_result("a1")], store, exp, "s")
