"""The sweep's own MLflow user in containers (issue #37 item 3): the Job mlflow-sweep-user of the rendered dev
overlay (deploy/base/mlflow/sweep-user-job.yaml), run by the stack fixture twice as every `kubectl apply -k`
would, creates the user of the Secret mlflow-tracking with EDIT on the experiment `calib-sweeps` only. Checked
against the stack's MLflow, as that user: it logs a run in its experiment, and the server refuses it (HTTP 403)
deleting another team's experiment, writing into it, deleting its own experiment or a run, and creating users;
the Job refuses a Secret that names the admin. Every other container test logs in as this user too (the sweeps
in test_containers_mlflow.py and test_containers_ray.py register their champion with it)."""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.containers.fixtures import built_images, run_job, stack  # noqa: F401

pytestmark = pytest.mark.container


def _call(stack, path: str, body: dict, auth) -> requests.Response:
    return requests.post(f"{stack.url}/api/2.0/mlflow/{path}", json=body, auth=auth, timeout=30)


def test_the_job_made_a_non_admin_user_with_edit_on_its_experiment(stack):
    assert "created user 'sweep'" in stack.job_logs["mlflow-sweep-user-0"]
    assert "user 'sweep' exists; password set from the Secret" in stack.job_logs["mlflow-sweep-user-1"]
    assert "has EDIT on experiment 'calib-sweeps'" in stack.job_logs["mlflow-sweep-user-1"]
    admin = (stack.secrets["mlflow-auth"]["admin-username"], stack.secrets["mlflow-auth"]["admin-password"])
    assert stack.auth[0] != admin[0]
    user = requests.get(
        f"{stack.url}/api/2.0/mlflow/users/get", params={"username": stack.auth[0]}, auth=admin, timeout=30
    )
    assert user.status_code == 200 and user.json()["user"]["is_admin"] is False


def test_the_sweep_user_writes_its_experiment_and_nothing_else(stack):
    admin = (stack.secrets["mlflow-auth"]["admin-username"], stack.secrets["mlflow-auth"]["admin-password"])
    own = requests.get(
        f"{stack.url}/api/2.0/mlflow/experiments/get-by-name",
        params={"experiment_name": "calib-sweeps"},
        auth=stack.auth,
        timeout=30,
    )
    assert own.status_code == 200, own.text
    own_id = own.json()["experiment"]["experiment_id"]
    run = _call(stack, "runs/create", {"experiment_id": own_id}, stack.auth)
    assert run.status_code == 200, run.text
    run_id = run.json()["run"]["info"]["run_id"]
    logged = _call(stack, "runs/log-metric", {"run_id": run_id, "key": "m", "value": 1.0, "timestamp": 0}, stack.auth)
    assert logged.status_code == 200, logged.text
    ended = _call(stack, "runs/update", {"run_id": run_id, "status": "FINISHED"}, stack.auth)
    assert ended.status_code == 200, ended.text

    other = _call(stack, "experiments/create", {"name": f"other-team-{uuid.uuid4().hex[:6]}"}, admin)
    assert other.status_code == 200, other.text
    other_id = other.json()["experiment_id"]
    refused = {
        "delete another experiment": _call(stack, "experiments/delete", {"experiment_id": other_id}, stack.auth),
        "write into another experiment": _call(stack, "runs/create", {"experiment_id": other_id}, stack.auth),
        "delete its own experiment": _call(stack, "experiments/delete", {"experiment_id": own_id}, stack.auth),
        "delete a run": _call(stack, "runs/delete", {"run_id": run_id}, stack.auth),
        "create a user": _call(stack, "users/create", {"username": "intruder", "password": "x" * 24}, stack.auth),
    }
    assert {k: r.status_code for k, r in refused.items()} == dict.fromkeys(refused, 403)
    # the refusals changed nothing
    got = requests.get(
        f"{stack.url}/api/2.0/mlflow/experiments/get", params={"experiment_id": other_id}, auth=admin, timeout=30
    )
    assert got.json()["experiment"]["lifecycle_stage"] == "active"
    run_now = requests.get(f"{stack.url}/api/2.0/mlflow/runs/get", params={"run_id": run_id}, auth=admin, timeout=30)
    assert run_now.json()["run"]["info"]["lifecycle_stage"] == "active"


def test_the_job_refuses_a_secret_that_names_the_admin(stack):
    admin = stack.secrets["mlflow-auth"]
    proc = run_job(
        stack.cluster,
        stack.resources,
        "mlflow-sweep-user",
        "mlflow-sweep-user-admin",
        extra_env=[
            {"name": "SWEEP_USERNAME", "value": admin["admin-username"]},
            {"name": "SWEEP_PASSWORD", "value": admin["admin-password"]},
        ],
    )
    assert proc.returncode != 0
    assert "is the admin: give Secret mlflow-tracking a user of its own" in proc.stderr
    assert admin["admin-password"] not in proc.stdout + proc.stderr
