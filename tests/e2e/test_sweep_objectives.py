"""The sweep targets robustness objectives: ECE under shift, OOD detection, multi-task data."""

from __future__ import annotations

import csv
import io

import pytest

from sweeps.config import METRIC_NAMES
from tests.sweep_helpers import launch, store, sweep_runs

pytestmark = pytest.mark.slow
SMALL = ["--set", "run.data.num_samples=1200", "--set", "run.train.epochs=2"]


def test_shift_objective_selects_on_validation_shift_ece_and_logs_tables(tmp_path):
    proc = launch(
        tmp_path,
        "--num-samples",
        "3",
        "--name",
        "shift",
        *SMALL,
        "--set",
        "evaluation.shift=true",
        "--set",
        "evaluation.shift_severities=[1,3,5]",
        "--set",
        "evaluation.ood=permuted",
        "--set",
        "search.objective=single",
        "--set",
        "search.metric=val_shift_ece",
        "--set",
        "selection.rule=min_metric",
        "--set",
        "selection.metric=val_shift_ece",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = store(tmp_path)
    parents, children = sweep_runs(client, "shift")
    assert len(children) == 3
    scores = {}
    for run in children:
        assert run.info.status == "FINISHED"
        m = run.data.metrics
        assert 0 <= m["val_shift_ece"] <= 1 and 0 <= m["test_shift_ece"] <= 1
        for key in ("val_ood_msp_auroc", "test_ood_msp_auroc", "val_ood_entropy_fpr95"):
            assert 0 <= m[key] <= 1, key
        names = {a.path for a in client.list_artifacts(run.info.run_id, "shift")}
        assert {"shift/shift_val.csv", "shift/shift_test.csv", "shift/shift_ece_test.png"} <= names
        text = client.download_artifacts(run.info.run_id, "shift/shift_val.csv", str(tmp_path))
        rows = list(csv.DictReader(io.StringIO(open(text).read())))
        assert sorted({int(r["severity"]) for r in rows}) == [1, 3, 5]
        # the logged summary is the mean of the table's rows
        assert m["val_shift_ece"] == pytest.approx(sum(float(r["ece"]) for r in rows) / len(rows), abs=1e-9)
        scores[run.data.tags["calib.trial_id"]] = m["val_shift_ece"]
    assert parents[0].data.tags["calib.champion_trial"] == min(scores, key=scores.get)


def test_multitask_sweep_reports_mean_and_per_task_metrics(tmp_path):
    proc = launch(
        tmp_path,
        "--num-samples",
        "2",
        "--name",
        "mtl",
        *SMALL,
        "--set",
        "run.data.name=mnist1d_mtl",
        "--set",
        "search.calibrators=[temperature,last_layer]",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = store(tmp_path)
    _, children = sweep_runs(client, "mtl")
    assert len(children) == 2
    for run in children:
        assert run.info.status == "FINISHED"
        m = run.data.metrics
        sweep_level = {f"val_{name}" for name in METRIC_NAMES}  # means over tasks, debiased estimators
        per_task = [
            v
            for k, v in m.items()
            if k.startswith("val_") and k.endswith("_ece") and k not in sweep_level and k.count("_") == 2
        ]
        assert len(per_task) >= 3
        assert m["val_ece"] == pytest.approx(sum(per_task) / len(per_task), abs=1e-9)
        assert "tasks/per_task.csv" in {a.path for a in client.list_artifacts(run.info.run_id, "tasks")}
