"""The service opens MLflow while Ray starts: a failed or interrupted Ray start leaves no parent run RUNNING (fast:
no Ray is started, connect_ray is replaced)."""

from __future__ import annotations

import pytest

from sweeps import service, service_start
from sweeps.api import resolve
from sweeps.contract import ROLE_PARENT, TAG_ROLE
from sweeps.integrations.mlflow.store import MlflowStore


def _parents(cfg):
    store = MlflowStore(cfg.tracking.uri)
    exp = store.client.get_experiment_by_name(cfg.tracking.experiment)
    return store.client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_PARENT}'")


@pytest.mark.parametrize(
    ("error", "status"), [(RuntimeError("the raylet did not start"), "FAILED"), (KeyboardInterrupt(), "KILLED")]
)
def test_a_ray_start_that_fails_ends_the_parent_run_it_raced_with(tmp_path, monkeypatch, error, status):
    cfg = resolve(None, ["name=racing", "search.num_samples=2"], workdir=tmp_path)

    def no_ray(cluster, plugins):
        raise error

    monkeypatch.setattr(service_start, "connect_ray", no_ray)
    with pytest.raises(type(error)):
        service.execute(cfg, cluster=False, resume=False)
    parents = _parents(cfg)
    assert [p.info.status for p in parents] == [status], [(p.info.status, p.data.tags) for p in parents]
