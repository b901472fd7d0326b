"""Build the images the container tests run, with podman, on this machine.

Docker Hub is not reachable here, so the public base images are stand-ins (standins/*.Dockerfile)
built on a Debian bookworm base bootstrapped with debootstrap (bootstrap_base.sh), and tagged with
the public names the project's Dockerfiles and manifests use (name:tag). docker/Dockerfile and
docker/mlflow.Dockerfile are then built with `--pull=never`, so they start FROM the stand-ins. Both
pin their base by digest (`FROM python:3.11.15-slim-bookworm@sha256:...`), which no local build can
match (a tag@digest reference resolves by the registry's digest, and --pull=never forbids the pull):
for the tests only, each is built from a temporary copy whose FROM has the digest stripped, the
rest of the file unchanged (the real builds use the Dockerfiles as they are; the digest and its
record are checked by tests/unit/deploy/test_deploy_consistency.py). Both Dockerfiles start from the same Python
image, so one stand-in (standins/python.Dockerfile) serves both.
pip inside the builds reaches PyPI through the host's TLS proxy: the host CA bundle is mounted at
/run/host-ca.crt and a pip.conf naming it at /etc/pip.conf (build-time mounts, not part of any
image); local PyPI mirrors of this machine (/opt/pypi*/simple) are offered as extra indexes when
present.

    python -m tests.containers.images            # build everything (cached layers are reused)
    python -m tests.containers.images --json F   # and write sizes and build times to F
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDINS = HERE / "standins"
REDIS_IMAGE = "localhost/calib-standin/redis:bookworm"
BASE = "localhost/calib-standin/debian:bookworm"
RAY_IMAGE = "localhost/calib-sweeps/ray:test"
MLFLOW_IMAGE = "localhost/calib-sweeps/mlflow:test"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
LOCAL_INDEXES = [Path("/opt/pypi/simple"), Path("/opt/pypi-more/simple")]


def run(cmd: list[str], log=None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if check and proc.returncode != 0:
        tail = "" if log else proc.stdout[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode})\n{tail}")
    return proc


def from_image(dockerfile: Path) -> str:
    froms = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.upper().startswith("FROM ")]
    assert len(froms) == 1, froms
    return froms[0]


def python_base() -> str:
    """The stand-in of the Python image both Dockerfiles start from, by its local name (no digest)."""
    return qualify(from_image(REPO / "docker" / "mlflow.Dockerfile").split("@", 1)[0])


def without_digest(text: str) -> str:
    """A Dockerfile's text with `@sha256:...` dropped from its FROM lines (tests only: the stand-ins are
    tagged name:tag, and a name:tag@digest reference cannot resolve to a local build)."""
    lines = []
    for line in text.splitlines(keepends=True):
        if line.upper().startswith("FROM "):
            line = re.sub(r"@sha256:[0-9a-f]{64}", "", line)
        lines.append(line)
    return "".join(lines)


def qualify(name: str) -> str:
    """The fully qualified name Docker resolves a short image name to."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def dev_overlay_images() -> dict[str, str]:
    """Public images the dev overlay runs besides ours: {role: image} (postgres, s3)."""
    from tests import deploy_render as dr

    images = {}
    for r in dr.render(dr.DEPLOY / "overlays" / "dev"):
        if r["kind"] == "StatefulSet":
            images[r["metadata"]["name"]] = r["spec"]["template"]["spec"]["containers"][0]["image"]
    # the stand-ins are tagged name:tag (a tag@digest reference cannot name a local build)
    return {"postgres": images["postgres"].split("@", 1)[0], "s3": images["minio"].split("@", 1)[0]}


def image_exists(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref]).returncode == 0


def image_size(ref: str) -> int:
    out = run(["podman", "image", "inspect", "--format", "{{.Size}}", ref]).stdout.strip()
    return int(out)


def _pip_mounts(tmp: Path) -> list[str]:
    conf = ["[global]", "cert = /run/host-ca.crt" if HOST_CA.exists() else ""]
    mounts = ["--network", "host"]
    if HOST_CA.exists():
        mounts += ["-v", f"{HOST_CA}:/run/host-ca.crt:ro"]
    indexes = [p for p in LOCAL_INDEXES if p.is_dir()]
    if indexes and os.environ.get("CALIB_CONTAINER_LOCAL_INDEXES", "1") != "0":
        conf.append("extra-index-url = " + " ".join(f"file://{p}" for p in indexes))
        for p in indexes:
            mounts += ["-v", f"{p.parent}:{p.parent}:ro"]
    (tmp / "pip.conf").write_text("\n".join(line for line in conf if line) + "\n")
    (tmp / "pip.conf").chmod(0o644)
    return mounts + ["-v", f"{tmp / 'pip.conf'}:/etc/pip.conf:ro"]


BUILD_CPU_SHARES_ENV = "CALIB_BUILD_CPU_SHARES"


def build(tag: str, dockerfile: Path, context: Path, log, extra_tags=()) -> dict:
    with tempfile.TemporaryDirectory(prefix="calib-build-") as tmp:
        # --format docker: OCI images have no HEALTHCHECK; `docker build` keeps it, so the test builds do too
        cmd = ["podman", "build", "--pull=never", "--layers", "--format", "docker", *_pip_mounts(Path(tmp))]
        # A build beside other work (CI's, in the background): its RUN steps run in containers of their own cgroup,
        # which `nice` does not reach and which weighs as much as a whole foreground process; low shares keep them
        # to what the foreground leaves (cgroup v1 cpu.shares; v2 maps it to a weight).
        if shares := os.environ.get(BUILD_CPU_SHARES_ENV):
            cmd += ["--cpu-shares", shares]
        text = dockerfile.read_text()
        used = dockerfile
        if without_digest(text) != text:  # the base pinned by digest: build a copy FROM the stand-in's tag
            used = Path(tmp) / dockerfile.name
            used.write_text(without_digest(text))
        cmd += ["-f", str(used), "-t", tag]
        for t in extra_tags:
            cmd += ["-t", t]
        print(f"$ {' '.join(cmd)} {context}", file=log, flush=True)
        t0 = time.monotonic()
        run([*cmd, str(context)], log=log)
        seconds = time.monotonic() - t0
    return {
        "image": tag,
        "dockerfile": str(dockerfile.relative_to(REPO)),
        "seconds": round(seconds, 1),
        "bytes": image_size(tag),
    }


def run_in_network(
    network: str, image: str, script: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """Run a shell script in IMAGE on a test network, with pip set up as in the builds."""
    with tempfile.TemporaryDirectory(prefix="calib-run-") as tmp:
        mounts = [a for a in _pip_mounts(Path(tmp)) if a not in ("--network", "host")]
        args = ["podman", "run", "--rm", "--network", network, *mounts]
        for k, v in (env or {}).items():
            args += ["-e", f"{k}={v}"]
        return subprocess.run(
            [*args, "--entrypoint", "/bin/sh", image, "-c", script], capture_output=True, text=True, timeout=timeout
        )


def build_all(log=None) -> dict:
    """Build base, stand-ins and the project's two images; return {name: info}."""
    log = log or sys.stderr
    run(["bash", str(HERE / "setup_podman.sh")], log=log)
    t0 = time.monotonic()
    run(["bash", str(HERE / "bootstrap_base.sh"), BASE], log=log)
    out = {"base": {"image": BASE, "seconds": round(time.monotonic() - t0, 1), "bytes": image_size(BASE)}}
    public = dev_overlay_images()
    # docker/Dockerfile (Ray) and docker/mlflow.Dockerfile start from the same Python image.
    bases = {from_image(REPO / "docker" / f).split("@", 1)[0] for f in ("Dockerfile", "mlflow.Dockerfile")}
    assert bases == {python_base().removeprefix("docker.io/library/")}, bases
    standins = {
        "python-base": (python_base(), "python.Dockerfile"),
        "postgres": (qualify(public["postgres"]), "postgres.Dockerfile"),
        "s3": (qualify(public["s3"]), "s3.Dockerfile"),
        # the external Redis of deploy/components/gcs-ft (not in the overlays: the user's own service)
        "redis": (REDIS_IMAGE, "redis.Dockerfile"),
    }
    for name, (tag, dockerfile) in standins.items():
        out[name] = build(tag, STANDINS / dockerfile, STANDINS, log)
        out[name]["stand_in"] = True
    out["ray"] = build(RAY_IMAGE, REPO / "docker" / "Dockerfile", REPO, log)
    out["mlflow"] = build(MLFLOW_IMAGE, REPO / "docker" / "mlflow.Dockerfile", REPO, log)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write sizes and build times here")
    args = p.parse_args(argv)
    if shutil.which("podman") is None and os.geteuid() != 0:
        print("podman is missing and only root can install it (tests/containers/setup_podman.sh)", file=sys.stderr)
        return 1
    info = build_all()
    for name, i in info.items():
        print(f"{name:12s} {i['image']:60s} {i['bytes'] / 1e9:6.2f} GB {i['seconds']:8.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
