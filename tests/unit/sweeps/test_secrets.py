"""Secrets in URIs are never printed or written (issue #22, item 1).

The one redaction rule (calib_core/redaction.py) on a table of URIs, malformed ones included; every error
path of `sweeps/launch.py` with a canary password (a random string) in a URI: exit 2, the canary in
neither stdout nor stderr, nothing written. The slow test runs a real sweep against a local
`mlflow server` with the canary as the tracking URI's password and searches everything the sweep
left (its output, Ray Tune's storage, the Optuna study, the server's database and artifacts).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from calib_core.redaction import MASK, has_credentials, redact, redact_text, redact_values
from tests.sweep_helpers import LAUNCH, free_port, mlflow_server

PW = "s3cr3t-Pa55"

# (value, what redact makes of it)
URIS = [
    # user-info passwords, any scheme
    ("http://alice:s3cr3t-Pa55@127.0.0.1:5055", f"http://alice:{MASK}@127.0.0.1:5055"),
    ("https://alice:s3cr3t-Pa55@mlflow.example/prefix/", f"https://alice:{MASK}@mlflow.example/prefix/"),
    ("postgresql://u:s3cr3t-Pa55@db:5432/optuna", f"postgresql://u:{MASK}@db:5432/optuna"),
    ("postgresql+psycopg://u:s3cr3t-Pa55@db/optuna", f"postgresql+psycopg://u:{MASK}@db/optuna"),
    ("mysql+pymysql://root:s3cr3t-Pa55@10.0.0.1:3306/x", f"mysql+pymysql://root:{MASK}@10.0.0.1:3306/x"),
    ("redis://:s3cr3t-Pa55@cache:6379/0", f"redis://:{MASK}@cache:6379/0"),
    ("http://u:s3cr3t-Pa55@[::1]:5000", f"http://u:{MASK}@[::1]:5000"),
    # a password holding '@', ':' or '/' unescaped: everything up to the last '@' goes
    ("postgresql://u:s3cr3t@Pa55@db/x", f"postgresql://u:{MASK}@db/x"),
    ("postgresql://u:s3:cr3t/Pa55@db/x", f"postgresql://u:{MASK}@db/x"),
    # malformed: a scheme typo, an unclosed IPv6 bracket, a bad port, no host
    ("htp://u:s3cr3t-Pa55@mlflow:5000", f"htp://u:{MASK}@mlflow:5000"),
    ("http://u:s3cr3t-Pa55@[::1", f"http://u:{MASK}@[::1"),
    ("postgres://u:s3cr3t-Pa55@[::1", f"postgres://u:{MASK}@[::1"),
    ("http://u:s3cr3t-Pa55@host:99999999", f"http://u:{MASK}@host:99999999"),
    ("postgresql://u:s3cr3t-Pa55@", f"postgresql://u:{MASK}@"),
    # secrets in the query string, any case
    ("https://h/p?password=s3cr3t-Pa55&x=1", f"https://h/p?password={MASK}&x=1"),
    ("https://h/p?x=1&TOKEN=s3cr3t-Pa55", f"https://h/p?x=1&TOKEN={MASK}"),
    ("https://h/p?access_token=s3cr3t-Pa55#top", f"https://h/p?access_token={MASK}#top"),
    ("https://h/p?client_secret=s3cr3t-Pa55", f"https://h/p?client_secret={MASK}"),
    ("https://h/p?api_key=s3cr3t-Pa55;sig=s3cr3t-Pa55", f"https://h/p?api_key={MASK};sig={MASK}"),
    (
        "https://acct.blob.core.windows.net/c?sv=2022&sig=s3cr3t-Pa55",
        f"https://acct.blob.core.windows.net/c?sv=2022&sig={MASK}",
    ),
    (
        "s3://bucket/k?X-Amz-Credential=s3cr3t-Pa55&X-Amz-Signature=s3cr3t-Pa55&X-Amz-Expires=60",
        f"s3://bucket/k?X-Amz-Credential={MASK}&X-Amz-Signature={MASK}&X-Amz-Expires=60",
    ),
    ("https://h/p?access_key=s3cr3t-Pa55&Signature=s3cr3t-Pa55", f"https://h/p?access_key={MASK}&Signature={MASK}"),
    (
        "postgresql://u@db/x?sslmode=require&password=s3cr3t-Pa55",
        f"postgresql://u@db/x?sslmode=require&password={MASK}",
    ),
    ("http://u:s3cr3t-Pa55@h/p?key=s3cr3t-Pa55", f"http://u:{MASK}@h/p?key={MASK}"),
    # nothing secret: unchanged
    ("http://mlflow:5000", "http://mlflow:5000"),
    ("https://mlflow.example/prefix/?experiment=3", "https://mlflow.example/prefix/?experiment=3"),
    ("postgresql://u@db:5432/optuna", "postgresql://u@db:5432/optuna"),
    ("sqlite:////abs/path/mlflow.db", "sqlite:////abs/path/mlflow.db"),
    ("http://host/path/a@b", "http://host/path/a@b"),
    ("memory", "memory"),
    ("/tmp/ray_results", "/tmp/ray_results"),
    ("", ""),
]


@pytest.mark.parametrize(("uri", "expected"), URIS, ids=[u or "empty" for u, _ in URIS])
def test_redact(uri, expected):
    assert redact(uri) == expected
    assert PW not in redact(uri)
    assert has_credentials(uri) == (expected != uri)
    assert redact(redact(uri)) == redact(uri)  # masking twice changes nothing


def test_redact_text_masks_every_uri_in_a_message():
    msg = (
        "error: tracking.uri: must be http(s)://host[:port] (got 'htp://u:s3cr3t-Pa55@mlflow:5000'); "
        'search.storage: "postgresql+psycopg://u:s3cr3t-Pa55@db/x" and `mysql://r:s3cr3t-Pa55@h/y`, '
        "see https://h/p?token=s3cr3t-Pa55\n  File x, line 3\nValueError: http://u:s3cr3t-Pa55@[::1"
    )
    out = redact_text(msg)
    assert PW not in out
    assert "htp://u:***@mlflow:5000'" in out
    assert '"postgresql+psycopg://u:***@db/x"' in out
    assert "`mysql://r:***@h/y`" in out
    assert "https://h/p?token=***" in out
    assert "http://u:***@[::1" in out
    assert redact_text("no URI here: a@b:c") == "no URI here: a@b:c"


def test_redact_values_walks_a_config():
    cfg = {"tracking": {"uri": f"http://a:{PW}@h"}, "search": {"storage": None, "calibrators": [f"x://u:{PW}@h"]}}
    out = redact_values(cfg)
    assert PW not in repr(out)
    assert out["tracking"]["uri"] == "http://a:***@h"
    assert out["search"]["storage"] is None
    assert PW in cfg["tracking"]["uri"]  # the input is not changed


def test_one_redaction_rule():
    """The old helpers are gone: preflight and the store use calib_core.redaction's."""
    import sweeps.checks.preflight
    import sweeps.integrations.mlflow.store

    assert sweeps.checks.preflight.redact is redact
    assert not hasattr(sweeps.integrations.mlflow.store, "_redact")


# --------------------------------------------------------------------------- the CLI's error paths


def _listing(d: Path) -> list[tuple[str, int, int]]:
    return [(str(p.relative_to(d)), p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(d.rglob("*"))]


def _env(extra: dict[str, str]) -> dict[str, str]:
    drop = (
        "RAY_ADDRESS",
        "CALIB_SHARED_STORAGE",
        "CALIB_ASSUME_AUTOSCALING",
        "MLFLOW_TRACKING_URI",
        "CALIB_OPTUNA_STORAGE",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "CALIB_PREFLIGHT_TIMEOUT_S": "2", **extra}


ERROR_CASES = [
    pytest.param(["--tracking-uri", "htp://u:{canary}@mlflow:5000"], {}, id="tracking-scheme-typo"),
    pytest.param(["--tracking-uri", "http://u:{canary}@[::1"], {}, id="tracking-unclosed-ipv6"),
    pytest.param(["--tracking-uri", "http://u:{canary}@127.0.0.1:{port}"], {}, id="tracking-no-server"),
    pytest.param(["--set", "search.storage=postgres://u:{canary}@[::1"], {}, id="storage-malformed"),
    pytest.param(["--set", "search.storage=postgresql://u:{canary}@[::1"], {}, id="storage-unclosed-ipv6"),
    pytest.param([], {"CALIB_OPTUNA_STORAGE": "postgresql://u:{canary}@127.0.0.1:{port}/x"}, id="env-storage-down"),
    pytest.param([], {"CALIB_OPTUNA_STORAGE": "postgres://u:{canary}@127.0.0.1:1/x"}, id="env-storage-typo"),
    pytest.param(["--num-samples", "http://u:{canary}@h"], {}, id="argparse-value"),
]


@pytest.mark.parametrize(("args", "env"), ERROR_CASES)
def test_error_lines_carry_no_password(tmp_path, args, env):
    canary = f"canary{secrets.token_hex(8)}"
    port = str(free_port())  # nothing listens there

    def fill(s: str) -> str:
        return s.replace("{canary}", canary).replace("{port}", port)

    before = _listing(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), *map(fill, args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env({k: fill(v) for k, v in env.items()}),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert canary not in proc.stdout
    assert canary not in proc.stderr, proc.stderr
    assert "***" in proc.stderr or "u:" not in proc.stderr, proc.stderr  # the URI is shown, masked
    assert _listing(tmp_path) == before  # nothing written


def test_dry_run_shows_the_config_without_passwords(tmp_path):
    canary = f"canary{secrets.token_hex(8)}"
    proc = subprocess.run(
        [
            sys.executable,
            str(LAUNCH),
            "--dry-run",
            "--tracking-uri",
            f"https://alice:{canary}@mlflow.example:5000/?token={canary}",
            "--set",
            f"search.storage=postgresql+psycopg://u:{canary}@db:5432/optuna",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env({}),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert canary not in proc.stdout + proc.stderr
    assert "https://alice:***@mlflow.example:5000/?token=***" in proc.stdout
    assert "postgresql+psycopg://u:***@db:5432/optuna" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_mlflow_run_links_are_silenced(monkeypatch):
    """MLflow prints "View run ... at: URL" (the URL with the password) when a run ends on a server;
    the store turns that off through MLflow's own switch, and forces it off when the URI has a password."""
    from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

    from sweeps.integrations.mlflow.retry import QUIET_RUN_LINKS_ENV, quiet_run_links

    assert QUIET_RUN_LINKS_ENV == MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name
    monkeypatch.setenv(QUIET_RUN_LINKS_ENV, "false")
    quiet_run_links("http://mlflow:5000")
    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is False  # a user's choice, nothing to hide
    quiet_run_links(f"http://alice:{PW}@mlflow:5000")
    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is True
    monkeypatch.delenv(QUIET_RUN_LINKS_ENV)
    quiet_run_links("http://mlflow:5000")
    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is True


def test_store_masks_params_tags_and_descriptions():
    """Every param, tag, note and model-version description the service writes goes through the store."""
    from sweeps.integrations.mlflow.store import MlflowStore

    calls: list[tuple] = []

    class Client:
        def __getattr__(self, name):
            return lambda *a, **k: calls.append((name, a, k)) or _Run()

    class _Run:
        class info:  # noqa: N801
            run_id = "r"

        class data:  # noqa: N801
            tags: dict = {}

        version = "1"

    s = MlflowStore("http://x", client=Client())
    uri = f"postgresql://u:{PW}@db/x"
    s.log_params("r", {"search.storage": uri, "n": 3})
    s.set_tags("r", {"calib.reason": f"OperationalError: cannot connect to {uri}"})
    s.append_to_note("r", f"study in {uri}")
    s.create_run("e", "t", {"note": uri})
    s.register("m", "mid", "r", f"from {uri}", {"k": uri})
    s.describe_version("m", "1", f"see {uri}")
    s.point_alias("m", "champion", "1", {"k": uri})
    assert calls and PW not in repr(calls)
    assert "postgresql://u:***@db/x" in repr(calls)


# --------------------------------------------------------------------------- a real sweep


def _files_with(root: Path, needle: bytes) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if needle in p.read_bytes():
                    found.append(str(p))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_sweep_with_a_password_in_the_tracking_uri_leaks_it_nowhere(tmp_path):
    canary = f"canary{secrets.token_hex(8)}"
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    with mlflow_server(f"sqlite:///{server_dir}/mlflow.db", server_dir / "mlartifacts") as url:
        uri = url.replace("http://", f"http://alice:{canary}@")
        # MLflow's switch for its run links is left unset, as a user would have it (the service sets it)
        env = {k: v for k, v in _env({}).items() if k != "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"}
        proc = subprocess.run(
            [
                sys.executable,
                str(LAUNCH),
                "--tracking-uri",
                uri,
                "--name",
                "secrets",
                "--num-samples",
                "2",
                "--max-concurrent",
                "2",
                "--set",
                f"search.storage=sqlite:///{work}/optuna.db",
                "--set",
                "run.train.epochs=1",
                "--set",
                "run.data.num_samples=600",
                "--set",
                "run.train.batch_size=64",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=900,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        from mlflow import MlflowClient

        client = MlflowClient(url)
        exp = client.get_experiment_by_name("calib-sweeps")
        runs = client.search_runs([exp.experiment_id])
        parent = next(r for r in runs if r.data.tags.get("calib.role") == "parent")
        assert parent.data.params["tracking.uri"] == url.replace("http://", "http://alice:***@")
    assert "Compare runs" in proc.stdout
    assert canary not in proc.stdout
    assert canary not in proc.stderr
    assert "View run" not in proc.stdout  # MLflow's own links (with the password) are off
    needle = canary.encode()
    assert (work / "ray_results" / "secrets").is_dir() and (work / "optuna.db").is_file()
    assert _files_with(work, needle) == []  # Ray Tune's storage, the Optuna study
    assert (server_dir / "mlflow.db").is_file() and (server_dir / "mlartifacts").is_dir()
    assert _files_with(server_dir, needle) == []  # the MLflow store, its artifacts, the server's log
