"""Shared pytest fixtures of the container tests (tests/test_containers_*.py, marker `container`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import deploy_render as dr
from tests.containers import images

ARTIFACTS = dr.REPO_ROOT / "test-artifacts" / "containers"


def _podman_usable() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (tests/containers/setup_podman.sh installs it)"
    proc = subprocess.run(["podman", "info"], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"podman does not work here: {proc.stderr[-300:]}"


@pytest.fixture(scope="session")
def built_images() -> dict:
    """Base, stand-ins and the project's images, built once per session (layer cache reused)."""
    why = _podman_usable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "build.log", "w") as log:
        info = images.build_all(log)
    (ARTIFACTS / "images.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def dev_secrets() -> dict[str, dict[str, str]]:
    """The dev overlay's Secrets, filled by deploy/render_secrets.py (random values)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_secrets", dr.DEPLOY / "render_secrets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.fill((dr.DEPLOY / "overlays" / "dev" / "secrets.example.yaml").read_text(), {})
    return {d["metadata"]["name"]: {k: str(v) for k, v in d["stringData"].items()}
            for d in yaml.safe_load_all(text) if d}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def artifacts_dir(name: str) -> Path:
    path = ARTIFACTS / name
    path.mkdir(parents=True, exist_ok=True)
    return path
