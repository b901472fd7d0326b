"""The champion's logged model made without reopening its trial's run (sweeps.integrations.mlflow.model_export).

Logged inside the run, MLflow's log_model reopens the run and copies every metric of the run onto the model, one
history request per metric (hundreds once the intervals are logged, each a round trip to a tracking server), after
which the run's status and end time need restoring. Here the logged model is created with the run as its source (the
run's params and MLflow's context tags, as log_model gives them), log_model writes into it with no run open, and one
request links it as the run's output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sweeps.integrations.mlflow.store import MlflowStore


def new_logged_model(store: MlflowStore, run_id: str, name: str, tags: dict[str, str]) -> Any:
    """A PENDING logged model `name` of `run_id`'s experiment, sourced from the run (its params and `tags`, with
    MLflow's context tags: user, source, git commit); an interrupted export leaves it PENDING, which
    MlflowStore.completed_export finalizes FAILED."""
    from mlflow.tracking.context.registry import resolve_tags

    run = store.get_run(run_id)
    return store.client.create_logged_model(
        run.info.experiment_id,
        name=name,
        source_run_id=run_id,
        tags=resolve_tags(tags),
        params={k: str(v) for k, v in run.data.params.items()},
    )


def link_output(store: MlflowStore, run_id: str, model_id: str) -> None:
    """The logged model as the run's output (what log_model inside the run records), in one request."""
    from mlflow.entities import LoggedModelOutput

    store.client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])


@contextlib.contextmanager
def pins_not_rechecked() -> Iterator[None]:
    """MLflow's warn_dependency_requirement_mismatches off for the block, where the model is saved and where MLflow
    loads it to validate the input example: it reads the file lists of every installed distribution (~1.3 s of CPU
    here), and the champion's pins are read from the installed distributions themselves (model_export's
    pip_requirements), so they cannot mismatch. Modules that no longer have the function are left alone."""
    import mlflow.pyfunc
    import mlflow.utils.environment

    name = "warn_dependency_requirement_mismatches"
    patched = [(m, getattr(m, name)) for m in (mlflow.utils.environment, mlflow.pyfunc) if hasattr(m, name)]
    for module, _ in patched:
        setattr(module, name, lambda requirements: None)
    try:
        yield
    finally:
        for module, check in patched:
            setattr(module, name, check)
