"""Malformed invocations of `sweeps/launch.py`, as a new user would type them (issue #12).

Each case runs the CLI as a subprocess in a fresh, empty working directory and checks the
promise of the README: exit code 2, exactly one line on stderr that starts with `error:` and
names the field or file, no traceback, and nothing written (the directory's listing, with sizes
and modification times, is the same after the run; no mlflow.db, mlartifacts or ray_results).
Almost every case fails before Ray, MLflow or torch is imported, in well under a second.

Permissions: these tests usually run as root, for whom os.access says every directory is
writable. Unwritable storage is therefore covered by paths on a kernel file system (/proc) and
under a file, and the permission cases (a mode-555 directory, a read-only store) run the CLI as
the unprivileged user 65534 (`nobody`, via setpriv) when the tests run as root.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"
NOBODY = 65534
SETPRIV = shutil.which("setpriv")  # util-linux: runs the CLI as NOBODY when the tests run as root
CASE_LIMIT_S = 30
# mostly waiting on interpreter start-up; fewer beside other pytest-xdist workers, whose tests share the cores (each
# case's time is held to CASE_LIMIT_S)
WORKERS = max(2, min(4, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOSED_PORT = _closed_port()
# hostile configs: an alias bomb (9^8 values once expanded), 20,000 levels of nesting, 1 MiB + 1 byte, a
# 900 KB name (under the size limit: its echo must be clipped), 2,000 unknown keys (one line, counted)
BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
"""
DEEP = "a: " + "[" * 20000 + "]" * 20000 + "\n"
BIG = "name: x\n" + "#" * (1 << 20) + "\n"
LONG_NAME = "name: " + "x" * 900_000 + "\n"
MANY_KEYS = "".join(f"key{i}: 1\n" for i in range(2000))
S3 = ["--storage-path", "s3://bucket/ray-results"]
SERVER = ["--tracking-uri", "http://mlflow.example:5000"]


@dataclass(frozen=True)
class Case:
    """One malformed invocation. `files`: name -> str | bytes (a file) | None (a folder), made in
    the working directory first ('locked*' ones read-only). `{cwd}` and `{port}` (a closed port)
    in args, env and needle are replaced. `needle`: a substring of the error line, or `re:PATTERN`."""

    cid: str
    args: tuple[str, ...]
    needle: str
    files: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    nobody: bool = False  # run as an unprivileged user (permission checks)
    limit_s: float = 30.0  # the model/data and disk checks build the model: torch's import, seconds on a busy machine


def case(
    cid: str,
    args: list[str],
    needle: str,
    files: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    nobody: bool = False,
    skip: str | None = None,
    limit_s: float = 30.0,
) -> Any:
    marks = [pytest.mark.skip(reason=skip)] if skip else []
    c = Case(cid, tuple(args), needle, tuple((files or {}).items()), tuple((env or {}).items()), nobody, limit_s)
    return pytest.param(c, id=cid, marks=marks)


CASES = [
    # --- the config file
    case("cfg-empty", ["--config", "cfg.yaml"], "cfg.yaml: the config file is empty", {"cfg.yaml": ""}),
    case(
        "cfg-only-comments",
        ["--config", "cfg.yaml"],
        "cfg.yaml: the config file is empty",
        {"cfg.yaml": "# nothing here\n"},
    ),
    case(
        "cfg-list",
        ["--config", "cfg.yaml"],
        "cfg.yaml: top level must be a mapping, got list",
        {"cfg.yaml": "- a\n- b\n"},
    ),
    case(
        "cfg-scalar",
        ["--config", "cfg.yaml"],
        "cfg.yaml: top level must be a mapping, got str",
        {"cfg.yaml": "just some words\n"},
    ),
    case(
        "cfg-yaml-unclosed-flow",
        ["--config", "cfg.yaml"],
        r"re:^error: cfg\.yaml:3:1: not valid YAML: ",
        {"cfg.yaml": "name: x\nsearch: {num_samples: 2\n"},
    ),
    case(
        "cfg-yaml-bad-indent",
        ["--config", "cfg.yaml"],
        "cfg.yaml:2:6: not valid YAML: mapping values are not allowed here",
        {"cfg.yaml": "name: x\n  bad: 1\n"},
    ),
    case(
        "cfg-yaml-tab",
        ["--config", "cfg.yaml"],
        r"re:^error: cfg\.yaml:2:1: not valid YAML: .*'\\t'",
        {"cfg.yaml": "run:\n\tseed: 1\n"},
    ),
    case(
        "cfg-yaml-unclosed-quote",
        ["--config", "cfg.yaml"],
        r"re:^error: cfg\.yaml:\d+:\d+: not valid YAML: ",
        {"cfg.yaml": 'name: "demo\n'},
    ),
    case(
        "cfg-duplicate-key",
        ["--config", "cfg.yaml"],
        "cfg.yaml:2:1: not valid YAML: duplicate key 'name'",
        {"cfg.yaml": "name: a\nname: b\n"},
    ),
    case(
        "cfg-latin1",
        ["--config", "cfg.yaml"],
        "cfg.yaml:1:10: not UTF-8 text (byte 0xe9)",
        {"cfg.yaml": b"name: caf\xe9\n"},
    ),
    case(
        "cfg-utf16",
        ["--config", "cfg.yaml"],
        "cfg.yaml:1:1: not UTF-8 text (byte 0xff)",
        {"cfg.yaml": "name: x\n".encode("utf-16")},
    ),
    case(
        "cfg-control-char",
        ["--config", "cfg.yaml"],
        "cfg.yaml:1:8: not valid YAML: control character U+0007",
        {"cfg.yaml": b"name: a\x07\n"},
    ),
    case("cfg-directory", ["--config", "confdir"], "confdir: is a directory", {"confdir": None}),
    case("cfg-missing", ["--config", "nope.yaml"], "config file not found: nope.yaml"),
    case("cfg-unknown-key", ["--config", "cfg.yaml"], "foo: unknown key", {"cfg.yaml": "name: x\nfoo: 1\n"}),
    case(
        "cfg-unknown-nested-key",
        ["--config", "cfg.yaml"],
        "run.train.epochz: unknown key",
        {"cfg.yaml": "run: {train: {epochz: 3}}\n"},
    ),
    case("cfg-section-not-mapping", ["--config", "cfg.yaml"], "search: Input should be", {"cfg.yaml": "search: 5\n"}),
    case("cfg-bad-value", ["--config", "cfg.yaml"], "search.num_samples", {"cfg.yaml": "search: {num_samples: -3}\n"}),
    # --- flags and --set
    case("set-no-equals", ["--set", "run.train.epochs"], "--set 'run.train.epochs': expected key=value"),
    case("set-empty-key", ["--set", "=3"], "--set '=3': empty key"),
    case("set-bad-yaml", ["--set", "run.train.lr=[1,"], "value is not valid YAML"),
    case("set-unknown-key", ["--set", "run.train.epochz=3"], "run.train.epochz: unknown key"),
    case("set-not-a-section", ["--set", "name.x=1"], "name is not a section"),
    case("set-wrong-type", ["--set", "run.train.epochs=many"], "run.train.epochs: Input should be a valid integer"),
    case("flag-wrong-type", ["--num-samples", "three"], "argument --num-samples: invalid int value: 'three'"),
    case("flag-unknown", ["--bogus"], "unrecognized arguments: --bogus"),
    case("flag-missing-value", ["--name"], "argument --name: expected one argument"),
    case("num-samples-zero", ["--num-samples", "0"], "search.num_samples"),
    case("num-samples-negative", ["--num-samples", "-4"], "search.num_samples"),
    case("max-concurrent-zero", ["--max-concurrent", "0"], "resources.max_concurrent"),
    case("seed-negative", ["--seed", "-1"], "run.seed: Input should be greater than or equal to 0"),
    case("seed-too-big", ["--seed", str(2**32)], "run.seed: Input should be less than or equal to"),
    case(
        "lr-low-equals-high",
        ["--set", "search.calibrator_lr.low=0.1", "--set", "search.calibrator_lr.high=0.1"],
        "search.calibrator_lr: low must be < high",
    ),
    case(
        "lr-high-infinite",
        ["--set", "search.calibrator_lr.high=.inf"],
        "search.calibrator_lr.high: Input should be a finite number (got inf)",
    ),
    case("train-lr-nan", ["--set", "run.train.lr=.nan"], "run.train.lr: Input should be a finite number"),
    case("cpus-infinite", ["--cpus-per-trial", "inf"], "resources.cpus_per_trial: Input should be a finite number"),
    case(
        "param-bound-infinite",
        ["--set", "search.params={train.lr: {type: loguniform, low: 1.0e-4, high: .inf}}"],
        "search.params.train.lr.high: Input should be a finite number",
    ),
    case("unknown-calibrator", ["--set", "search.calibrators=[temperature,platt]"], "unknown calibrator 'platt'"),
    case("unknown-objective", ["--set", "search.objective=pareto"], "search.objective"),
    case("asha-with-multi", ["--set", "search.scheduler=asha"], "scheduler 'asha' needs objective 'single'"),
    case(
        "metric-not-val",
        ["--set", "search.objective=single", "--set", "search.metric=ece"],
        "search.metric: must be a validation metric",
    ),
    case("selection-metric-test", ["--set", "selection.metric=test_ece"], "selection.metric: must be a validation"),
    case("severities-out-of-range", ["--set", "evaluation.shift_severities=[0,6]"], "evaluation.shift_severities"),
    case("name-with-spaces", ["--name", "my sweep"], "name: must be 1-100 characters"),
    case("name-empty", ["--name", ""], "name: must be 1-100 characters"),
    case("experiment-empty", ["--set", "tracking.experiment="], "tracking.experiment: must not be empty"),
    case("experiment-blank", ["--set", "tracking.experiment='  '"], "tracking.experiment: must not be empty"),
    case(
        "registered-model-empty",
        ["--set", "tracking.registered_model="],
        "tracking.registered_model: must not be empty",
    ),
    case(
        "registered-model-slash",
        ["--set", "tracking.registered_model=team/model"],
        "tracking.registered_model: 'team/model' must not contain '/'",
    ),
    case("gpus-too-fine", ["--gpus-per-trial", "0.00001"], "resources.gpus_per_trial: Ray counts resources in steps"),
    case("cuda-device-without-gpus", ["--set", "run.device=cuda"], "run.device: 'cuda' needs resources.gpus_per_trial"),
    case("cifar-without-root", ["--set", "run.data.name=cifar10"], "run.data.root: cifar10 is read from"),
    case(
        "cifar-root-missing",
        ["--set", "run.data.name=cifar10", "--set", "run.data.root={cwd}/nodata"],
        "run.data.root: {cwd}/nodata is not a folder",
    ),
    # --- the tracking store
    case("tracking-scheme-wrong", ["--tracking-uri", "ftp://example/mlflow"], "tracking.uri: must be sqlite:///"),
    case("tracking-empty", ["--tracking-uri", ""], "tracking.uri"),
    case(
        "tracking-sqlite-relative",
        ["--tracking-uri", "sqlite:///sub/mlflow.db"],
        "tracking.uri: 'sqlite:///sub/mlflow.db' is a relative SQLite path",
    ),
    case(
        "tracking-sqlite-dir-missing",
        ["--tracking-uri", "sqlite:///{cwd}/missing/mlflow.db"],
        # the study's file defaults to the same folder: one problem said once, naming both fields
        "tracking.uri: the folder {cwd}/missing of the SQLite store does not exist (create it, or point the URI"
        " elsewhere) (the folder of search.storage's study too)",
    ),
    case(
        "tracking-sqlite-is-dir",
        ["--tracking-uri", "sqlite:///{cwd}/store.db"],
        "tracking.uri: {cwd}/store.db is not a file",
        {"store.db": None},
    ),
    case(
        "tracking-sqlite-not-sqlite",
        ["--tracking-uri", "sqlite:///{cwd}/notes.db"],
        "tracking.uri: {cwd}/notes.db is not a SQLite database",
        {"notes.db": "my notes\n"},
    ),
    case(
        "tracking-sqlite-damaged",
        [],
        "tracking.uri: cannot read the MLflow store at sqlite:///{cwd}/mlflow.db",
        {"mlflow.db": b"SQLite format 3\x00" + bytes(range(256)) * 20},
    ),
    case(
        "tracking-artifacts-is-file",
        [],
        "tracking.uri: {cwd}/mlartifacts (the artifact folder beside the store)",
        {"mlartifacts": "x"},
    ),
    case(
        "tracking-sqlite-on-proc",
        ["--tracking-uri", "sqlite:////proc/self/mlflow.db"],
        "tracking.uri: /proc/self is on /proc, a proc file system",
    ),
    case(
        "tracking-server-unreachable",
        ["--tracking-uri", "http://127.0.0.1:{port}"],
        "tracking.uri: no MLflow server answers at http://127.0.0.1:{port} (Connection refused)",
    ),
    case(
        "tracking-db-unreachable",
        ["--tracking-uri", "postgresql://u:secret@127.0.0.1:{port}/mlflow"],
        "tracking.uri: no database answers at 127.0.0.1:{port}",
    ),
    case(
        "tracking-sqlite-readonly-store",
        ["--tracking-uri", "sqlite:///{cwd}/locked.db"],
        "tracking.uri: {cwd}/locked.db is not writable",
        {"locked.db": b""},
        nobody=True,
    ),
    # --- the storage path
    case("storage-empty", ["--storage-path", ""], "storage_path: must not be empty"),
    case("storage-bad-scheme", ["--storage-path", "ftp://bucket/x"], "storage_path: must be a directory path"),
    case(
        "storage-is-file",
        ["--storage-path", "results"],
        "storage_path: {cwd}/results is a file, not a folder",
        {"results": "x"},
    ),
    case(
        "storage-under-file",
        ["--storage-path", "f/sub"],
        "storage_path: {cwd}/f is a file, so {cwd}/f/sub cannot",
        {"f": "x"},
    ),
    case(
        "storage-on-proc",
        ["--storage-path", "/proc/sys/ray_results"],
        "storage_path: /proc/sys/ray_results is on /proc, a proc file system",
    ),
    case(
        "storage-file-uri-on-proc",
        ["--storage-path", "file:///proc/sys/ray_results"],
        "storage_path: /proc/sys/ray_results is on /proc",
    ),
    case("storage-file-uri-with-host", ["--storage-path", "file://server/results"], "storage_path: 'file://server/"),
    case(
        "storage-dir-mode-555",
        ["--storage-path", "{cwd}/locked/results"],
        "storage_path: no permission to create {cwd}/locked/results under {cwd}/locked",
        {"locked": None},
        nobody=True,
    ),
    case(
        "storage-under-private-dir",
        ["--storage-path", "{cwd}/private/results"],
        "storage_path: Permission denied ({cwd}/private/results)",
        {"private": None},
        nobody=True,
        skip=None if os.geteuid() == 0 else "needs root: a folder of root's that the CLI's user cannot enter",
    ),
    # --- resources on this machine
    case(
        "gpus-per-trial-2-locally",
        ["--gpus-per-trial", "2"],
        "resources.gpus_per_trial: a trial asks for 2 GPUs but this machine has no GPU",
        env={"CUDA_VISIBLE_DEVICES": ""},
    ),
    case(
        "cpus-per-trial-64-locally",
        ["--cpus-per-trial", "64"],
        "resources.cpus_per_trial: a trial asks for 64 CPUs but this machine offers",
        skip="this machine has 64 CPUs or more" if (os.cpu_count() or 1) >= 64 else None,
    ),
    case(
        "cpus-per-trial-huge-locally",
        ["--cpus-per-trial", "100000"],
        "resources.cpus_per_trial: a trial asks for 100000 CPUs",
    ),
    # --- --cluster
    case(
        "cluster-local-storage",
        ["--cluster", *SERVER, "--storage-path", "/tmp/r"],
        "storage_path: '/tmp/r' is a local directory",
    ),
    case("cluster-no-storage", ["--cluster", *SERVER], "storage_path: --cluster needs shared storage"),
    case(
        "cluster-file-storage",
        ["--cluster", *SERVER, "--storage-path", "file:///shared/r"],
        "storage_path: 'file:///shared/r' (file://) is local to each node",
    ),
    case(
        "cluster-memory-storage",
        ["--cluster", *SERVER, "--storage-path", "memory://r"],
        "storage_path: 'memory://r' (memory://) is local",
    ),
    case("cluster-sqlite", ["--cluster", "--tracking-uri", "sqlite:////tmp/x.db", *S3], "tracking.uri: 'sqlite:////"),
    case("cluster-no-tracking", ["--cluster", *S3], "tracking.uri: --cluster needs an MLflow server"),
    case(
        "cluster-loopback-tracking",
        ["--cluster", "--tracking-uri", "http://127.0.0.1:5000", *S3],
        "tracking.uri: 'http://127.0.0.1:5000' is a loopback address",
    ),
    case(
        "cluster-loopback-127-8", ["--cluster", "--tracking-uri", "http://127.1.2.3:5000", *S3], "is a loopback address"
    ),
    case(
        "cluster-localhost-tracking",
        ["--cluster", "--tracking-uri", "https://localhost", *S3],
        "tracking.uri: 'https://localhost' is a loopback address",
    ),
    case(
        "cluster-ipv6-loopback-tracking",
        ["--cluster", "--tracking-uri", "http://[::1]:5000", *S3],
        "tracking.uri: 'http://[::1]:5000' is a loopback address",
    ),
    case(
        "cluster-not-running",
        ["--cluster", *SERVER, *S3],
        "--cluster: no Ray cluster answers at 127.0.0.1:{port} (Connection refused)",
        env={"RAY_ADDRESS": "127.0.0.1:{port}"},
    ),
    case(
        "cluster-client-not-running",
        ["--cluster", *SERVER, *S3],
        "--cluster: no Ray cluster answers at ray://127.0.0.1:{port}",
        env={"RAY_ADDRESS": "ray://127.0.0.1:{port}"},
    ),
    case(
        "cluster-bad-address",
        ["--cluster", *SERVER, *S3],
        "--cluster: RAY_ADDRESS='head' is not host:port",
        env={"RAY_ADDRESS": "head"},
    ),
    # --- hostile inputs (issue #22): bounded YAML, strict types, clipped echoes, URIs, model/data, sizes
    case("yaml-alias-bomb", ["--config", "bomb.yaml"], "bomb.yaml: more than 100000 values", {"bomb.yaml": BOMB}),
    case("yaml-deep", ["--config", "deep.yaml"], "deep.yaml: nested deeper than 64 levels", {"deep.yaml": DEEP}),
    case("yaml-recursive", ["--config", "rec.yaml"], "rec.yaml: a recursive alias", {"rec.yaml": "a: &a [*a]\n"}),
    case("cfg-too-big", ["--config", "big.yaml"], "a config file may have at most 1048576", {"big.yaml": BIG}),
    case("cfg-nul-in-path", ["--config", "a\x01b.yaml"], "config file not found"),
    case("bool-for-int", ["--set", "run.train.epochs=true"], "run.train.epochs: expected a number, not a boolean"),
    case("bool-for-float", ["--set", "run.train.lr=false"], "run.train.lr: expected a number, not a boolean"),
    case("int-overflow", ["--set", "run.train.epochs=" + "9" * 30], "run.train.epochs: integer out of range"),
    case("int-5000-digits", ["--set", "search.num_samples=" + "9" * 5000], "--set search.num_samples: a value cannot"),
    case(
        "num-samples-huge", ["--set", "run.data.num_samples=2000000000"], "run.data.num_samples: Input should be less"
    ),
    case("name-newline", ["--name", "sweep\n"], "name: must be 1-100 characters"),
    case("name-10mb-clipped", ["--config", "name.yaml"], "name: must be 1-100 characters", {"name.yaml": LONG_NAME}),
    case("unknown-keys-many", ["--config", "keys.yaml"], "and 1995 more problems", {"keys.yaml": MANY_KEYS}),
    case("tracking-ipv6-malformed", ["--tracking-uri", "http://u:pw@[::1"], "tracking.uri: http://u:***@[::1 is not"),
    case(
        "storage-ipv6-malformed",
        ["--set", "search.storage=postgresql://u:pw@[::1/x"],
        "search.storage: postgresql://u:***@[::1/x is not a valid URI",
    ),
    case(
        "storage-hdfs-no-lib", ["--storage-path", "hdfs://nn:8020/x"], "storage_path: cannot write to hdfs://nn:8020/x"
    ),
    case("storage-s3-unreachable", ["--storage-path", "s3://bucket/x"], "storage_path: cannot write to s3://bucket/x"),
    case(
        "model-data-mismatch",
        ["--set", "run.model.name=resnet18"],
        "run.model.name: 'resnet18' cannot take mnist1d",
        limit_s=90,
    ),
    case(
        "trials-do-not-fit-disk",
        ["--num-samples", "10000000"],
        "search.num_samples: 10000000 trials keep about",
        limit_s=90,
    ),
]


def _listing(d: Path) -> list[tuple[str, int, int]]:
    """Everything under `d` (hidden files too): relative path, size, modification time."""
    out = []
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out.append((str(p.relative_to(d)), st.st_size if p.is_file() else -1, st.st_mtime_ns))
    return out


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "CALIB_SHARED_STORAGE", "CALIB_ASSUME_AUTOSCALING", "MLFLOW_TRACKING_URI")
    }
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


@dataclass
class Outcome:
    cwd: Path
    before: list[tuple[str, int, int]]
    after: list[tuple[str, int, int]]
    rc: int
    stdout: str
    stderr: str
    took: float


def _run(c: Case, base: Path) -> Outcome:
    as_nobody = c.nobody and os.geteuid() == 0
    cwd = Path(tempfile.mkdtemp(prefix=f"{c.cid}-", dir=base))
    if as_nobody:  # the user must be able to enter it
        cwd.chmod(0o777)

    def fill(s: str) -> str:
        return s.replace("{cwd}", str(cwd)).replace("{port}", str(CLOSED_PORT))

    for name, content in c.files:
        p = cwd / name
        if content is None:
            p.mkdir()
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        if name.startswith("locked"):  # read-only for everyone but root
            p.chmod(0o555 if content is None else 0o444)
        if name.startswith("private"):  # root's alone (the case runs as NOBODY)
            p.chmod(0o700)
    before = _listing(cwd)
    drop = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if as_nobody else []
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*drop, sys.executable, str(LAUNCH), *[fill(a) for a in c.args]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=c.limit_s + 30,
        env=_env({k: fill(v) for k, v in c.env}),
    )
    took = time.perf_counter() - t0
    return Outcome(cwd, before, _listing(cwd), proc.returncode, proc.stdout, proc.stderr, took)


@pytest.fixture(scope="module")
def outcomes(request) -> Iterator[dict[str, Future]]:
    """Every selected case, started at once on a few workers (each is mostly interpreter start-up)."""
    selected = {
        item.callspec.id
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_malformed_invocation" and hasattr(item, "callspec")
    }
    # not under pytest's base temp (mode 700): the unprivileged user of the permission cases must reach it
    base = Path(tempfile.mkdtemp(prefix="calib-cli-"))
    base.chmod(0o755)
    runnable = [p.values[0] for p in CASES if p.id in selected and not p.marks]
    if os.geteuid() == 0 and SETPRIV is None:
        runnable = [c for c in runnable if not c.nobody]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield {c.cid: pool.submit(_run, c, base) for c in runnable}
    for p in [*base.rglob("locked*"), *base.rglob("private*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("c", CASES)
def test_malformed_invocation(outcomes, c: Case):
    if c.nobody and os.geteuid() == 0 and SETPRIV is None:
        pytest.skip("running as root without setpriv(1): cannot drop to an unprivileged user")
    o = outcomes[c.cid].result()
    lines = o.stderr.splitlines()
    assert o.rc == 2, (o.rc, o.stdout[-2000:], o.stderr[-3000:])
    assert "Traceback" not in o.stderr, o.stderr
    assert len(lines) == 1 and lines[0].strip(), f"expected one stderr line, got {len(lines)}:\n{o.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    assert len(line) <= 300, f"error line of {len(line)} characters"
    needle = c.needle.replace("{cwd}", str(o.cwd)).replace("{port}", str(CLOSED_PORT))
    if needle.startswith("re:"):
        assert re.search(needle[3:], line), (needle, line)
    else:
        assert needle in line, (needle, line)
    assert o.after == o.before, "the CLI wrote into the working directory"
    assert o.took < c.limit_s, f"took {o.took:.1f} s"


def test_at_least_forty_cases():
    assert len(CASES) >= 40


def test_parent_run_tags_agree_with_tracking():
    from sweeps import contract
    from sweeps.integrations.mlflow import tracking

    assert (contract.TAG_SWEEP, contract.TAG_ROLE) == (tracking.TAG_SWEEP, tracking.TAG_ROLE)


def test_failing_fast_imports_neither_ray_nor_mlflow_nor_torch(tmp_path):
    """A bad value fails before the heavy imports (that is what makes it fast)."""
    code = (
        f"import sys; sys.argv = ['launch.py', '--num-samples', '0']; sys.path.insert(0, {str(ROOT)!r})\n"
        "from sweeps.cli import main\n"
        "rc = main()\n"
        "heavy = [m for m in ('ray', 'mlflow', 'torch', 'optuna') if m in sys.modules]\n"
        "print(rc, heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=_env({})
    )
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr


def test_a_fifo_as_config_is_refused_without_blocking(tmp_path):
    """A named pipe would block a reader for ever: refused by its file type, before it is opened."""
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), "--config", str(fifo)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {fifo}: not a regular file (a pipe, socket or device); give a YAML file"
    ]
    assert time.perf_counter() - t0 < CASE_LIMIT_S
