"""The images, built for real with podman (`make test-containers`; marker `container`): the
stand-ins keep the public images' contract, the project's Dockerfiles build unchanged on them
with --pull=never, and the demo sweep runs inside the project image as the manifests run it
(non-root user, read-only root filesystem, only the manifest's volumes writable)."""

from __future__ import annotations

import re

import pytest

from tests import deploy_render as dr
from tests.containers import images
from tests.containers.fixtures import artifacts_dir, built_images, dev_secrets  # noqa: F401
from tests.containers.harness import Cluster, podman

pytestmark = pytest.mark.container


def _sh(image: str, script: str, user: str | None = None) -> str:
    args = ["run", "--rm"] + (["--user", user] if user else []) + ["--entrypoint", "/bin/sh", image, "-c", script]
    proc = podman(*args)
    return proc.stdout.strip()


def test_everything_builds_and_is_measured(built_images):
    for name in ("base", "python-base", "postgres", "s3", "ray", "mlflow"):
        assert built_images[name]["bytes"] > 0, name
    assert built_images["ray"]["image"] == images.RAY_IMAGE


def test_the_builds_strip_only_the_base_digest():
    """The test builds use a copy of each Dockerfile whose FROM names the stand-in's tag (images.py);
    the FROM line is the only difference."""
    for name in ("Dockerfile", "mlflow.Dockerfile"):
        text = (images.REPO / "docker" / name).read_text()
        stripped = images.without_digest(text)
        base = images.from_image(images.REPO / "docker" / name)
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
        changed = [(a, b) for a, b in zip(text.splitlines(), stripped.splitlines(), strict=True) if a != b]
        assert len(changed) == 1 and changed[0][1] == changed[0][0].split("@", 1)[0], changed


def test_ray_image_keeps_what_kuberay_and_the_manifests_relied_on_from_rayproject_ray(built_images):
    """No rayproject/ray base any more: the image itself keeps that image's contract where the manifests and
    KubeRay use it (user ray 1000:100, HOME /home/ray, bash, python and ray on PATH, Ray's dashboard deps for
    the head's job API and the agents' health endpoint); the installed packages are root's, read-only to it."""
    out = _sh(
        images.RAY_IMAGE,
        "id -u; id -g; id -un; echo $HOME; command -v python; command -v ray; test -x /bin/bash && echo bash; "
        "python -c 'import ray, sys, ray.dashboard.optional_deps; "
        "print(ray.__version__, sys.version_info[:2] == (3, 11))'; "
        "python -c 'import os, torch; print(os.access(os.path.dirname(torch.__file__), os.W_OK))'; "
        "stat -c %u:%g /home/ray /home/ray/app",
    )
    assert out.split("\n") == [
        "1000",
        "100",
        "ray",
        "/home/ray",
        "/usr/local/bin/python",
        "/usr/local/bin/ray",
        "bash",
        "2.60.0 True",
        "False",
        "1000:100",
        "1000:100",
    ]


def test_python_stand_in_keeps_the_official_contract(built_images):
    out = _sh(
        built_images["python-base"]["image"],
        "id -u; command -v python; command -v pip; python -c 'import site; print(site.getsitepackages()[0])'",
    )
    assert out.split("\n") == [
        "0",
        "/usr/local/bin/python",
        "/usr/local/bin/pip",
        "/usr/local/lib/python3.11/site-packages",
    ]


def test_postgres_and_s3_stand_ins_keep_the_contract(built_images):
    out = _sh(built_images["postgres"]["image"], "id -u postgres; id -g postgres; echo $PGDATA; command -v pg_isready")
    assert out.split("\n")[:3] == ["999", "999", "/var/lib/postgresql/data"] and out.endswith("pg_isready")
    entry = podman("image", "inspect", "--format", "{{json .Config.Entrypoint}}", built_images["s3"]["image"]).stdout
    assert "docker-entrypoint.sh" in entry


def test_project_images_run_as_their_users(built_images):
    out = _sh(
        images.RAY_IMAGE,
        "id -u; id -g; pwd; python -c 'import ray, torch, calib_core, sweeps; "
        'print(ray.__version__, torch.__version__.split("+")[0])\'; test -f README.md && echo readme; '
        "echo $MLFLOW_DISABLE_TELEMETRY $DO_NOT_TRACK $RAY_USAGE_STATS_ENABLED",
    )
    assert out.split("\n") == ["1000", "100", "/home/ray/app", "2.60.0 2.14.1", "readme", "true true 0"]
    out = _sh(
        images.MLFLOW_IMAGE,
        "id -u; command -v mlflow-db-upgrade mlflow-entrypoint.sh; "
        "python -c 'import mlflow; print(mlflow.__version__)'; echo $MLFLOW_DISABLE_TELEMETRY",
    )
    lines = out.split("\n")
    assert lines[0] == "10001" and lines[-2:] == ["3.17.2", "true"]
    assert podman("run", "--rm", images.MLFLOW_IMAGE, check=False).returncode != 0  # no DSN: refuses


def test_demo_sweep_runs_in_the_image_as_the_manifest_runs_it(built_images, tmp_path):
    """The RayJob GPU worker's pod template (user, read-only root, volumes, memory limit, env,
    token Secret; the worker is where trials run), running the embedded demo sweep locally in the
    container to a registered champion."""
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    job = next(r for r in resources if r["kind"] == "RayJob")
    head = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    cluster = Cluster(resources, dev_secrets(), tmp_path)
    try:
        command = [
            "python",
            "/home/ray/app/sweeps/launch.py",
            "--config",
            "/home/ray/app/sweeps/configs/mnist1d_demo.yaml",
            "--num-samples",
            "2",
            "--max-concurrent",
            "2",
            "--set",
            "run.train.epochs=2",
            "--tracking-uri",
            "sqlite:////tmp/mlflow.db",
            "--storage-path",
            "/tmp/ray_results",
            "--name",
            "in-image",
        ]
        spec = head["spec"]
        c = dict(spec["containers"][0])
        proc = cluster.run_container("head", spec, c, labels={}, detach=False, command=command, timeout=900)
        out = proc.stdout + proc.stderr
        (artifacts_dir("demo") / "in-image.log").write_text(out)
        assert proc.returncode == 0, out[-4000:]
        assert "Registered: models:/calibrated-mnist1d@champion" in out
        # Nothing was written outside the manifest's volumes: the root filesystem is read-only.
        assert "Read-only file system" not in out
    finally:
        cluster.close()


def test_images_keep_their_healthcheck_pass_pip_check_and_quiet_gitpython(built_images):
    """The MLflow image's HEALTHCHECK (docker/mlflow-healthcheck: HTTPS, then HTTP) survives the build (docker
    format, as `docker build` makes it), both images' installed requirements are consistent (`pip check`, also run
    in the builds), and MLflow's GitPython import (`import git`, as MLflow does for a run's source) prints no
    warning in an image without git."""
    health = podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", images.MLFLOW_IMAGE).stdout
    assert "mlflow-healthcheck" in health, health
    script = podman("run", "--rm", "--entrypoint", "cat", images.MLFLOW_IMAGE, "/usr/local/bin/mlflow-healthcheck")
    assert "/health" in script.stdout, script.stdout
    for image in (images.RAY_IMAGE, images.MLFLOW_IMAGE):
        proc = podman("run", "--rm", "--entrypoint", "pip", image, "check", check=False)
        assert proc.returncode == 0 and "No broken requirements" in proc.stdout, (image, proc.stdout + proc.stderr)
        # MLflow imports GitPython when it records a run's source; without git it warns unless told not to
        proc = podman("run", "--rm", "--entrypoint", "python", image, "-c", "import git", check=False)
        assert proc.returncode == 0 and "git" not in proc.stderr.lower(), (image, proc.stderr[-2000:])
