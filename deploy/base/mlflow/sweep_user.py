"""Set up the sweep's own MLflow user: a non-admin account with EDIT on the sweep's experiments only.

Run by the Job mlflow-sweep-user (mlflow/sweep-user-job.yaml) in the MLflow image, as the admin of the Secret
mlflow-auth; the sweep (Ray head and workers) logs in with the Secret mlflow-tracking, whose user this creates.
Idempotent, so the Job can run on every apply and after a password rotation:

- waits until the server answers /health (WAIT_TIMEOUT s);
- refuses when the sweep's username is the admin's (the sweep must never hold admin rights);
- creates the user, or re-sets its password from the Secret and takes admin rights away if someone gave them;
- per experiment in SWEEP_EXPERIMENTS (comma-separated): creates it when missing (tagged as a classic ML
  experiment, as the sweep would), restores it when deleted, and grants the user EDIT on it. EDIT logs runs,
  params, metrics, tags and artifacts and ends runs; it cannot delete runs or experiments, nor touch any
  other experiment (the server's default permission, READ, lets it read them);
- per registered model in SWEEP_REGISTERED_MODELS that already exists (made by an admin before): EDIT, so the
  sweep can add versions and move the champion alias. Models the sweep creates are its own (MANAGE).

Environment: MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME / _PASSWORD (the admin), SWEEP_USERNAME /
SWEEP_PASSWORD, SWEEP_EXPERIMENTS, SWEEP_REGISTERED_MODELS, WAIT_TIMEOUT (default 600);
MLFLOW_TRACKING_SERVER_CERT_PATH when the server speaks TLS with a private CA.
"""

from __future__ import annotations

import os
import sys
import time

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # sweeps/contract.py: the tag the sweep sets on its experiments
CLASSIC_ML = "custom_model_development"


def _names(var: str) -> list[str]:
    return [n.strip() for n in os.environ.get(var, "").split(",") if n.strip()]


def wait_for_server(uri: str, timeout: float) -> None:
    """Return once GET <uri>/health answers 200; exit with a one-line error after `timeout` seconds."""
    import requests

    verify = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{uri.rstrip('/')}/health", timeout=10, verify=verify).status_code == 200:
                return
            last = "not ready"
        except requests.RequestException as exc:
            last = type(exc).__name__
        time.sleep(3)
    sys.exit(f"sweep-user: MLflow at {uri} did not answer /health within {timeout:g} s ({last})")


class AuthApi:
    """The basic-auth app's REST API (the endpoints of mlflow.server.auth.client.AuthServiceClient), called through
    MLflow's own HTTP helpers: importing that client would import the server-side auth app, which reads the
    server's basic_auth.ini at import."""

    def __init__(self, uri: str) -> None:
        from mlflow.utils.credentials import get_default_host_creds

        self.creds = get_default_host_creds(uri)

    def _call(self, path: str, method: str, **kwargs):
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        resp = verify_rest_response(http_request(self.creds, path, method, **kwargs), path)
        return resp.json() if resp.content else {}

    def get_user(self, user: str) -> dict:
        return self._call("/api/2.0/mlflow/users/get", "GET", params={"username": user})["user"]

    def create_user(self, user: str, password: str) -> None:
        self._call("/api/2.0/mlflow/users/create", "POST", json={"username": user, "password": password})

    def update_user_password(self, user: str, password: str) -> None:
        self._call("/api/2.0/mlflow/users/update-password", "PATCH", json={"username": user, "password": password})

    def update_user_admin(self, user: str, is_admin: bool) -> None:
        self._call("/api/2.0/mlflow/users/update-admin", "PATCH", json={"username": user, "is_admin": is_admin})

    def grant_user_permission(self, user: str, resource_type: str, resource_id: str, permission: str) -> None:
        body = {"username": user, "resource_type": resource_type, "resource_id": resource_id, "permission": permission}
        self._call("/api/3.0/mlflow/users/permissions/grant", "POST", json=body)

    def revoke_user_permission(self, user: str, resource_type: str, resource_id: str) -> None:
        body = {"username": user, "resource_type": resource_type, "resource_id": resource_id}
        self._call("/api/3.0/mlflow/users/permissions/revoke", "POST", json=body)


def grant_edit(auth: AuthApi, user: str, resource_type: str, resource_id: str) -> None:
    """Give `user` exactly EDIT on the resource (a grant is not an update: an earlier one, perhaps raised to MANAGE
    by hand, is revoked first)."""
    from mlflow.exceptions import RestException

    try:
        auth.grant_user_permission(user, resource_type, resource_id, "EDIT")
    except RestException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        auth.revoke_user_permission(user, resource_type, resource_id)
        auth.grant_user_permission(user, resource_type, resource_id, "EDIT")


def main() -> int:
    from mlflow import MlflowClient
    from mlflow.exceptions import RestException

    uri = os.environ["MLFLOW_TRACKING_URI"]
    user, password = os.environ["SWEEP_USERNAME"], os.environ["SWEEP_PASSWORD"]
    if not user or not password:
        sys.exit("sweep-user: SWEEP_USERNAME and SWEEP_PASSWORD (Secret mlflow-tracking) must not be empty")
    if user == os.environ.get("MLFLOW_TRACKING_USERNAME"):
        sys.exit(f"sweep-user: the sweep's user {user!r} is the admin: give Secret mlflow-tracking a user of its own")
    wait_for_server(uri, float(os.environ.get("WAIT_TIMEOUT", "600")))
    auth = AuthApi(uri)
    client = MlflowClient(uri)
    try:
        existing = auth.get_user(user)
    except RestException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        existing = None
    if existing is None:
        auth.create_user(user, password)
        print(f"sweep-user: created user {user!r}")
    else:
        auth.update_user_password(user, password)
        if existing.get("is_admin"):
            auth.update_user_admin(user, False)
            print(f"sweep-user: took admin rights from {user!r}")
        print(f"sweep-user: user {user!r} exists; password set from the Secret")
    for name in _names("SWEEP_EXPERIMENTS"):
        exp = client.get_experiment_by_name(name)
        if exp is None:
            eid = client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: CLASSIC_ML})
        else:
            eid = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(eid)
        grant_edit(auth, user, "experiment", eid)
        print(f"sweep-user: {user!r} has EDIT on experiment {name!r} (id {eid})")
    for name in _names("SWEEP_REGISTERED_MODELS"):
        try:
            client.get_registered_model(name)
        except RestException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            print(f"sweep-user: registered model {name!r} does not exist yet (the sweep will own it)")
            continue
        grant_edit(auth, user, "registered_model", name)
        print(f"sweep-user: {user!r} has EDIT on registered model {name!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
