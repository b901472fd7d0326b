"""Property-based tests of `sweeps/launch.py` with generated configs and argument lists (issue #22 item 5).

Hypothesis generates invocations of the CLI, valid and hostile: wrong types (booleans, strings, lists,
mappings, floats where integers are expected and the reverse), sizes (huge integers, negative numbers, 0,
strings up to about 100 KB), unicode (control characters, NUL, newlines, RTL marks, emoji), deep nesting,
unknown keys, YAML aliases (bombs and recursive ones too), URI-shaped values for tracking.uri,
search.storage and storage_path (odd schemes, user-info, IPv6 brackets, ports out of range), `--set` pairs
with odd keys and values, and the flags with random values. Each one runs as a subprocess in a fresh,
otherwise empty working directory, and for EVERY case:

- the exit code is 0 or 2 (never 1, never a signal) and stderr has no "Traceback";
- stderr has at most 2 lines (split at \\n and \\r), each at most 300 characters;
- nothing is written in the working directory on exit 2, nor by a dry run (its listing, with sizes and
  modification times, is the same after the run);
- it finishes within 60 s, and within 5 s when it is refused (exit 2); the longest exit-2 case is printed.

Nothing here starts a sweep: the valid and the hostile cases always pass `--dry-run` (which validates the
values and prints the resolved config), and the cases run without `--dry-run` always carry one value that
the schema refuses (e.g. `--num-samples 0`, an unknown key), so they must stop at validation, exit 2.

Each case costs about a second (interpreter start-up), so the default run draws few examples (fixed
seed: `derandomize=True`, the same cases on every run, no example database written); the tests marked
`slow` draw hundreds (`pytest -m slow tests/unit/sweeps/test_cli_properties.py`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"
LIMIT_S = 60.0  # every case
LIMIT_INVALID_S = 5.0  # every case refused with exit 2
MAX_STDERR_LINES = 2
MAX_LINE = 300
MAX_ARG_BYTES = 100_000  # one argv string (Linux refuses one above 128 KiB)
LONG = 100_000  # the longest generated string, in characters

# examples per test: (default run, slow run)
EXAMPLES = {"valid": (20, 60), "hostile": (25, 150), "no_dry_run": (10, 30)}

CALIBRATORS = ("temperature", "vector", "matrix", "dirichlet", "mlp", "last_layer")
BASELINES = ("none", "ce_es", "posthoc_temperature", "posthoc_vector", "posthoc_matrix")
NOWHERE = "/nonexistent-calib-pbt"  # absolute paths in generated values point below it (a dry run checks no path)


# --------------------------------------------------------------------------- running one case


class Invocation:
    """One generated invocation: argv after `launch.py`, and files made in the working directory first
    (name -> bytes, or None for a folder)."""

    def __init__(self, args: tuple[str, ...], files: tuple[tuple[str, bytes | None], ...] = ()) -> None:
        self.args, self.files = args, files

    def __repr__(self) -> str:  # what Hypothesis prints for a failing example: long values clipped
        files = {n: (None if b is None else _clip(b)) for n, b in self.files}
        return f"Invocation(args={[_clip(a) for a in self.args]!r}, files={files!r})"


def _clip(v: Any, n: int = 300) -> Any:
    return v if len(v) <= n else v[:n] + (f"...<{len(v)} in all>" if isinstance(v, str) else b"...")


@dataclass
class Stats:
    cases: int = 0
    by_rc: dict[int, int] = field(default_factory=dict)
    max_s: float = 0.0
    max_exit2_s: float = 0.0
    slowest_exit2: str = ""

    def line(self, name: str) -> str:
        rcs = ", ".join(f"exit {k}: {v}" for k, v in sorted(self.by_rc.items()))
        return (
            f"{name}: {self.cases} cases ({rcs}); longest case {self.max_s:.2f} s; "
            f"longest exit-2 case {self.max_exit2_s:.2f} s {self.slowest_exit2}"
        )


def _listing(d: Path) -> list[tuple[str, int, int]]:
    """Everything under `d` (hidden files too): relative path, size, modification time."""
    out = []
    for p in sorted(d.rglob("*")):
        st_ = p.lstat()
        out.append((str(p.relative_to(d)), st_.st_size if p.is_file() else -1, st_.st_mtime_ns))
    return out


def _env() -> dict[str, str]:
    drop = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "CALIB_OPTUNA_STORAGE", "CALIB_SHARED_STORAGE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CALIB_ASSUME")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1"}


def _lines(stderr: str) -> list[str]:
    text = stderr[:-1] if stderr.endswith("\n") else stderr
    return re.split(r"\r\n|\r|\n", text) if text else []


def check_invocation(inv: Invocation, base: Path, stats: Stats, expect_rc: tuple[int, ...] = (0, 2)) -> int:
    """Run one case in a fresh folder under `base`; assert the CLI's promises; returns the exit code."""
    cwd = Path(tempfile.mkdtemp(prefix="case-", dir=base))
    try:
        for name, content in inv.files:
            p = cwd / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                p.mkdir(exist_ok=True)
            else:
                p.write_bytes(content)
        before = _listing(cwd)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, str(LAUNCH), *inv.args],
                cwd=cwd,
                capture_output=True,
                timeout=LIMIT_S + 30,
                env=_env(),
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {LIMIT_S + 30:.0f} s: {inv!r}")
        took = time.perf_counter() - t0
        after = _listing(cwd)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    rc = proc.returncode
    err = proc.stderr.decode("utf-8", "replace")
    stats.cases += 1
    stats.by_rc[rc] = stats.by_rc.get(rc, 0) + 1
    stats.max_s = max(stats.max_s, took)
    if rc == 2 and took > stats.max_exit2_s:
        stats.max_exit2_s, stats.slowest_exit2 = took, f"({_clip(' '.join(inv.args), 120)})"
    tail = err[-3000:]
    assert rc in expect_rc, f"exit code {rc} (expected one of {expect_rc}); stderr:\n{tail}"
    assert "Traceback" not in err, f"a traceback on stderr:\n{tail}"
    lines = _lines(err)
    assert len(lines) <= MAX_STDERR_LINES, f"{len(lines)} lines on stderr:\n{tail}"
    for line in lines:
        assert len(line) <= MAX_LINE, f"a stderr line of {len(line)} characters: {_clip(line, 400)!r}"
    if rc == 2 or "--dry-run" in inv.args:
        assert after == before, f"exit {rc} but the working directory changed: {sorted(set(after) ^ set(before))}"
    assert took < LIMIT_S, f"took {took:.1f} s"
    if rc == 2:  # an invalid invocation is refused at once (interpreter start-up and validation)
        assert took < LIMIT_INVALID_S, f"exit 2 after {took:.1f} s"
    return rc


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="calib-cli-props-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- YAML text


def yaml_scalar(v: Any, ascii_only: bool = False) -> str:
    """A scalar as YAML text that PyYAML reads back as the same value (JSON strings are YAML)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        s = repr(v)
        if "e" in s and "." not in s.split("e")[0]:  # PyYAML (YAML 1.1) reads 1e-05 as a string
            mant, exp = s.split("e")
            s = f"{mant}.0e{exp}"
        return s
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=ascii_only)
    return json.dumps(str(v))


def flow(v: Any, path: tuple = (), marks: dict[tuple, str] | None = None, ascii_only: bool = False) -> str:
    """`v` as flow-style YAML; `marks` puts an anchor ('&a') on a path or replaces a value by an alias ('*a')."""
    marks = marks or {}
    mark = marks.get(path, "")
    if mark.startswith("*"):
        return mark
    pre = mark + " " if mark else ""
    if isinstance(v, dict):
        items = ", ".join(
            f"{yaml_scalar(k, ascii_only)}: {flow(x, (*path, k), marks, ascii_only)}" for k, x in v.items()
        )
        return pre + "{" + items + "}"
    if isinstance(v, list):
        return pre + "[" + ", ".join(flow(x, (*path, i), marks, ascii_only) for i, x in enumerate(v)) + "]"
    return pre + yaml_scalar(v, ascii_only)


def document(cfg: dict, style: str, marks: dict[tuple, str] | None = None) -> str:
    """A config mapping as a YAML file: one flow mapping per top-level key, block style, or JSON."""
    if style == "json" and not marks:
        return json.dumps(cfg, ensure_ascii=False, allow_nan=False) + "\n"
    if style == "block" and not marks:
        return yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False)
    return "".join(f"{yaml_scalar(k)}: {flow(v, (k,), marks)}\n" for k, v in cfg.items())


def nest(leaves: dict[tuple, Any]) -> dict:
    out: dict = {}
    for path, v in leaves.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return out


# --------------------------------------------------------------------------- valid values

NAME = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z", fullmatch=True)
PRINTABLE = st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"])


def floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def label(max_len: int, forbidden: str = "") -> st.SearchStrategy[str]:
    """tracking.experiment / registered_model: printable, no white space at either end, no control character."""
    return (
        st.text(PRINTABLE, min_size=1, max_size=min(max_len, 60))
        .map(lambda s: "".join(c for c in s if c not in forbidden).strip() or "m")
        .filter(lambda s: s not in (".", ".."))
    )


@st.composite
def log_range(draw: Any) -> dict[str, float]:
    low = draw(floats(1e-8, 1.0))
    return {"low": low, "high": low * draw(floats(1.5, 1e4))}


HOSTS = st.sampled_from(
    ["mlflow.example", "mlflow.example.com", "10.0.0.5", "[fd00::5]", "[2001:db8::1]", "xn--e1afmkfd.example"]
)
USERINFO = st.sampled_from(["", "user@", "user:secret@", "u%40x:p%2Fw@", "team:p@ss:w/rd@"])
PORT = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))

VALID_TRACKING = st.one_of(
    st.builds(lambda p: f"sqlite:///{NOWHERE}/{p}/mlflow.db", NAME),
    st.builds(lambda s, u, h, p: f"{s}://{u}{h}{p}", st.sampled_from(["http", "https"]), USERINFO, HOSTS, PORT),
    st.builds(
        lambda s, u, h, p, n: f"{s}://{u}{h}{p}/{n}",
        st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "mysql+pymysql"]),
        USERINFO,
        HOSTS,
        PORT,
        NAME,
    ),
)
VALID_STUDY = st.one_of(
    st.just("memory"),
    st.builds(lambda p: f"sqlite:///{NOWHERE}/{p}/optuna.db", NAME),
    st.builds(
        lambda s, u, h, p, n: f"{s}://{u}{h}{p}/optuna-{n}",  # never the MLflow store's URI
        st.sampled_from(["postgresql", "postgresql+psycopg", "mysql"]),
        USERINFO,
        HOSTS,
        PORT,
        NAME,
    ),
)
VALID_STORAGE = st.one_of(
    NAME.map(lambda n: f"results/{n}"),
    NAME.map(lambda n: f"{NOWHERE}/{n}"),
    NAME.map(lambda n: f"./{n}/../{n}"),
    NAME.map(lambda n: f"~/ray-results/{n}"),
    st.builds(lambda s, n: f"{s}://bucket-1/{n}", st.sampled_from(["s3", "gs", "gcs", "abfs"]), NAME),
    NAME.map(lambda n: f"hdfs://namenode:8020/{n}"),
    NAME.map(lambda n: f"file://{NOWHERE}/{n}"),
)

# every value here passes validation (and a dry run), whatever the others are (the combinations that the
# schema refuses are avoided: search.storage is never tracking.uri, run.device is 'cpu' or 'auto')
VALID_LEAVES: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("name",): NAME,
    ("storage_path",): VALID_STORAGE,
    ("run", "seed"): st.integers(0, 2**32 - 1),
    ("run", "device"): st.sampled_from(["auto", "cpu"]),
    ("run", "num_threads"): st.none() | st.integers(1, 256),
    ("run", "data", "num_samples"): st.integers(100, 1_000_000),
    ("run", "data", "val_fraction"): floats(0.01, 0.49),
    ("run", "data", "test_fraction"): floats(0.01, 0.49),
    ("run", "data", "augment"): st.booleans(),
    ("run", "data", "label_noise"): floats(0.0, 0.89),
    ("run", "data", "imbalance_ratio"): st.none() | floats(1.0, 1000.0),
    ("run", "train", "epochs"): st.integers(1, 10**6),
    ("run", "train", "batch_size"): st.integers(1, 10**6),
    ("run", "train", "optimizer"): st.sampled_from(["sgd", "adam", "adamw"]),
    ("run", "train", "lr"): floats(1e-8, 10.0),
    ("run", "train", "momentum"): floats(0.0, 0.99),
    ("run", "train", "weight_decay"): floats(0.0, 1.0),
    ("run", "train", "lr_schedule"): st.sampled_from(["none", "cosine", "step"]),
    ("run", "train", "calibrator_lr"): floats(1e-8, 10.0),
    ("run", "train", "calibrator_steps"): st.integers(1, 100),
    ("run", "train", "warmup_epochs"): st.integers(0, 100),
    ("run", "train", "calibrator_data"): st.sampled_from(["same", "lookahead", "holdout:0.1", "holdout:.25"]),
    ("run", "train", "num_bins"): st.integers(1, 1000),
    ("run", "train", "label_smoothing"): floats(0.0, 0.99),
    ("search", "num_samples"): st.integers(1, 10**6),
    # with at least one one-go calibrator: reference points alone run once each, so more trials than those is
    # refused (tests/unit/sweeps/test_selection_margin.py checks that line)
    ("search", "calibrators"): st.lists(
        st.sampled_from(CALIBRATORS + BASELINES), min_size=1, max_size=6, unique=True
    ).filter(lambda cs: any(c in CALIBRATORS for c in cs)),
    ("search", "calibrator_lr"): log_range(),
    ("search", "seed"): st.integers(0, 2**32 - 1),
    ("search", "grace_period"): st.integers(1, 100),
    ("search", "storage"): VALID_STUDY,
    ("search", "storage_outage_timeout_s"): floats(0.001, 1e6),
    ("resources", "cpus_per_trial"): floats(1e-4, 1e4),
    ("resources", "gpus_per_trial"): st.just(0.0) | floats(1e-4, 16.0),
    ("resources", "max_concurrent"): st.integers(1, 10**6),
    ("resources", "max_failures"): st.integers(0, 100),
    ("resources", "checkpoints_to_keep"): st.none() | st.integers(1, 100),
    ("resources", "pending_timeout_s"): st.none() | floats(0.001, 1e6),
    ("tracking", "uri"): VALID_TRACKING,
    ("tracking", "experiment"): label(500),
    ("tracking", "registered_model"): label(256, forbidden="/:@"),
    ("tracking", "outage_timeout_s"): floats(0.001, 1e6),
    ("selection", "accuracy_tolerance"): floats(0.0, 1.0),
    ("selection", "confidence"): floats(0.5, 0.999),
    ("selection", "num_resamples"): st.integers(100, 20_000),
    ("selection", "dominance_factor"): st.none() | floats(0.01, 0.99),
    ("evaluation", "shift_severities"): st.lists(st.integers(1, 5), min_size=1, max_size=5),
}
KNOWN_PATHS = list(VALID_LEAVES)
# alias pairs in a valid config: the anchor comes first in document order, both fields take the value
ALIAS_PAIRS = [(("run", "seed"), ("search", "seed")), (("run", "train", "lr"), ("run", "train", "calibrator_lr"))]


@st.composite
def valid_leaves(draw: Any, min_size: int = 0, max_size: int = 12) -> dict[tuple, Any]:
    paths = draw(st.lists(st.sampled_from(KNOWN_PATHS), min_size=min_size, max_size=max_size, unique=True))
    paths.sort(key=KNOWN_PATHS.index)  # document order as in the table
    return {p: draw(VALID_LEAVES[p]) for p in paths}


def set_pair(path: tuple, value: Any) -> str:
    return f"{'.'.join(path)}={flow(value)}"


FLAG_FIELDS = {
    "--num-samples": ("search", "num_samples"),
    "--max-concurrent": ("resources", "max_concurrent"),
    "--cpus-per-trial": ("resources", "cpus_per_trial"),
    "--gpus-per-trial": ("resources", "gpus_per_trial"),
    "--seed": ("run", "seed"),
    "--name": ("name",),
    "--tracking-uri": ("tracking", "uri"),
    "--storage-path": ("storage_path",),
}


def flag_text(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


@st.composite
def valid_invocations(draw: Any) -> Invocation:
    args: list[str] = []
    files: list[tuple[str, bytes | None]] = []
    source = draw(st.sampled_from(["default", "file", "file", "repo"]))
    if source == "repo":
        args += [
            "--config",
            str(ROOT / "sweeps" / "configs" / draw(st.sampled_from(["mnist1d_demo.yaml", "digits_demo.yaml"]))),
        ]
    elif source == "file":
        leaves = draw(valid_leaves(min_size=1))
        marks: dict[tuple, str] = {}
        for a, b in ALIAS_PAIRS:
            if a in leaves and draw(st.booleans()):
                leaves[b] = leaves[a]
                marks = {a: "&x", b: "*x"}
                leaves = {p: leaves[p] for p in sorted(leaves, key=KNOWN_PATHS.index)}
                break
        style = draw(st.sampled_from(["flow", "block", "json"]))
        text = document(nest(leaves), style, marks)
        if draw(st.booleans()):
            text = "# generated\n" + text + "# end\n"
        data = text.encode()
        if draw(st.integers(0, 9)) == 0:
            data = b"\xef\xbb\xbf" + data  # a UTF-8 byte order mark
        files.append(("cfg.yaml", data))
        args += ["--config", "cfg.yaml"]
    # --set pairs and flags, valid one by one; the combination checked (and a conflicting pair dropped)
    chosen = draw(valid_leaves(max_size=5))
    for path, value in chosen.items():
        args += ["--set", set_pair(path, value)]
    for flag in draw(st.lists(st.sampled_from(list(FLAG_FIELDS)), max_size=4, unique=True)):
        args += [flag, flag_text(draw(VALID_LEAVES[FLAG_FIELDS[flag]]))]
    if draw(st.booleans()):
        args.append("--verbose")
    args.insert(0, "--dry-run")  # first: no generated value can take it for its own
    return Invocation(tuple(args), tuple(files))


# --------------------------------------------------------------------------- hostile values

ODD_CHARS = st.sampled_from(
    ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\u200f", "\u202e", "\u2028", "\ufeff", "\ufffe",
     "😀", "👩", "\u200d", "ß", "İ", "٣", "\u0301", " ", "\\", '"', "'", ":", "#", "&", "*", "!", "%", "@",
     "[", "{", "=", ".", "/", "~", "-", ",", "?", "|", ">"]
)  # fmt: skip
CHAR = st.one_of(st.characters(codec="utf-8"), ODD_CHARS)


def hostile_text(max_size: int = 30) -> st.SearchStrategy[str]:
    short = st.text(CHAR, max_size=max_size)
    long = st.builds(
        lambda s, n: (s * (n // len(s) + 1))[:n], st.text(CHAR, min_size=1, max_size=4), st.integers(200, LONG)
    )
    return st.one_of(short, short, short, long)


def argv_safe(s: str) -> str:
    """No NUL (argv cannot hold one), at most MAX_ARG_BYTES bytes of UTF-8."""
    s = s.replace("\x00", "")
    b = s.encode()
    return s if len(b) <= MAX_ARG_BYTES else b[:MAX_ARG_BYTES].decode("utf-8", "ignore")


NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-5, 5e-5, 1e-300, 5e-324, 1e308, 0.5, 1.5]),
)
NUMBER_TEXT = st.one_of(
    NUMBERS.map(str),
    st.sampled_from(
        [
            "1e400",
            "-1e400",
            "nan",
            "inf",
            "-inf",
            "NaN",
            "0x10",
            "0o17",
            "0b11",
            "1_000",
            "+5",
            "-0",
            " 7 ",
            "٣",
            "３",
            "1.",
            ".5",
            "1e3",
            "1E3",
            "5e-5",
            "1/2",
            "2**32",
            "9" * 5000,
            "4" * 4301,
            "",
            " ",
            "--",
            "-5",
        ]
    ),  # fmt: skip
)
YAML_ODD = st.sampled_from(
    ["true", "yes", "on", "off", "null", "~", "[]", "{}", "[1,", "{a: 1", "&a 1", "*a", "!!binary aGk=",
     "!!python/object/apply:os.system [echo hi]", "!!set {a, b}", "2024-01-01", "2024-01-01T00:00:00Z", "? a",
     "- x", "|\n x", "'unterminated", '"\\x00"', '"\\uD800"', '"\\u202e"', "!!float 1", "!!int x", "!!str 5",
     "<<: {a: 1}", "{<<: [*a]}", "[*a]", "a: &a [*a]", "!custom 1", "%YAML 1.2\n---\n1", "--- 1\n--- 2", "..."]
)  # fmt: skip


def deep(n: int, leaf: str = "1") -> str:
    return "[" * n + leaf + "]" * n


def alias_bomb(width: int, levels: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "{" + ", ".join(lines) + "}"


def _value_tree() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), NUMBERS, hostile_text(20))
    keys = st.one_of(st.sampled_from([p[-1] for p in KNOWN_PATHS] + ["run", "search", "x", ""]), hostile_text(10))
    return st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(keys, c, max_size=4),
        max_leaves=12,
    )


VALUES = _value_tree()
YAML_VALUE_TEXT = st.one_of(
    VALUES.map(flow),
    NUMBER_TEXT,
    YAML_ODD,
    hostile_text(),
    st.integers(1, 300).map(deep),
    st.builds(alias_bomb, st.integers(2, 12), st.integers(2, 9)),
)

SCHEMES = st.one_of(
    st.sampled_from(
        [
            "http",
            "https",
            "HTTP",
            "htp",
            "sqlite",
            "postgresql",
            "postgresql+psycopg",
            "postgres",
            "mysql",
            "mysql+pymysql",
            "databricks",
            "file",
            "s3",
            "gs",
            "gcs",
            "abfs",
            "hdfs",
            "memory",
            "ftp",
            "javascript",
            "data",
            "a+b.c-d",
            "1http",
            "",
            "spéciale",
            "s3 ",
        ]
    ),  # fmt: skip
    hostile_text(8),
)
URI_HOSTS = st.one_of(
    st.sampled_from(
        [
            "mlflow.example",
            "127.0.0.1",
            "0.0.0.0",
            "localhost",
            "[::1]",
            "[::1",
            "::1]",
            "[fe80::1%25eth0]",
            "[fe80::1%eth0]",
            "[v1.x]",
            "[]",
            "[::ffff:10.0.0.1]",
            "256.256.256.256",
            "例え.jp",
            "xn--",
            "",
            ".",
            "..",
            "a" * 300,
            "host:80:90",
            "@",
            "h@h",
            "%00",
            "bucket",
        ]
    ),  # fmt: skip
    hostile_text(12),
)
URI_USERINFO = st.one_of(
    st.sampled_from(["", "u@", "u:pw@", ":pw@", "u:@", "u:p@ss@", "u:p/w@", "u:p?w#x@", "ü:ñ@", "u:%zz@", "@@"]),
    hostile_text(10).map(lambda s: s + "@"),
)
URI_PORTS = st.one_of(
    st.sampled_from(["", ":", ":0", ":-1", ":65535", ":65536", ":99999", ":" + "9" * 30, ":abc", ":٣", ": 80"]),
    st.integers(-(10**6), 10**6).map(lambda p: f":{p}"),
)
URI_TAILS = st.one_of(
    st.sampled_from(
        [
            "",
            "/",
            "/db",
            "/x/../..",
            "/%00",
            "//",
            "/a b",
            "?token=abc",
            "?a=b&password=c#frag",
            "/db?sslmode=require",
            "#",
            "/\u202e",
            "/😀",
            "/" + "p" * 2000,
        ]
    ),  # fmt: skip
    hostile_text(20).map(lambda s: "/" + s),
)
SEPARATORS = st.sampled_from(["://", "://", "://", ":", ":/", ":///", ":////", "//", ""])


@st.composite
def uris(draw: Any) -> str:
    s = draw(SCHEMES) + draw(SEPARATORS) + draw(URI_USERINFO) + draw(URI_HOSTS) + draw(URI_PORTS) + draw(URI_TAILS)
    return s


URI_FIELDS = [("tracking", "uri"), ("search", "storage"), ("storage_path",)]
CONFIG_PATHS = st.one_of(
    st.sampled_from(
        [
            "nope.yaml",
            "",
            ".",
            "/",
            "dir",
            "dir/",
            "/dev/null",
            "/proc/self/status",
            "cfg.yaml/x",
            "x/../x/../x/../cfg.yaml",
            "~nosuchuser/cfg.yaml",
            "-",
            "cfg.yaml\n",
        ]
    ),  # fmt: skip
    st.integers(50, 1500).map(lambda n: "x/.." + "/x/.." * n + "/dir"),
    hostile_text(40),
)
INT_FLAGS = ["--num-samples", "--max-concurrent", "--seed"]
FLOAT_FLAGS = ["--cpus-per-trial", "--gpus-per-trial"]
STR_FLAGS = ["--name", "--tracking-uri", "--storage-path"]
ODD_ARGS = st.sampled_from(
    ["--bogus", "--Num-Samples", "-z", "--dryrun", "-", "--", "---", "--set", "--name", "--seed", "--config",
     "--num-samples=3", "--set=run.seed=1", "--cluster", "--resume"]
)  # fmt: skip
KEY_TEXT = st.one_of(
    st.sampled_from([".".join(p) for p in KNOWN_PATHS] + ["run", "search", "name.x", "run..seed", ".run", "run.",
                                                          "search.params.train.lr", "run.model.kwargs.x", "a" * 500]),
    hostile_text(30),
)  # fmt: skip


@st.composite
def config_mutation(draw: Any, leaves: dict[tuple, Any]) -> tuple[dict[tuple, Any], dict[tuple, str], str | None]:
    """Change a config's leaves: (new leaves, alias marks, raw YAML text that replaces the document or None)."""
    kind = draw(
        st.sampled_from(["value", "value", "uri", "unknown", "section", "deep", "alias", "bomb", "recursive", "raw"])
    )
    leaves = dict(leaves)
    marks: dict[tuple, str] = {}
    if kind == "value":
        leaves[draw(st.sampled_from(KNOWN_PATHS))] = draw(VALUES)
    elif kind == "uri":
        leaves[draw(st.sampled_from(URI_FIELDS))] = draw(uris())
    elif kind == "unknown":
        prefix = draw(st.sampled_from([(), ("run",), ("run", "train"), ("search",), ("resources",), ("tracking",)]))
        leaves[(*prefix, draw(hostile_text(20)) or "x")] = draw(VALUES)
    elif kind == "section":
        sec = draw(st.sampled_from(["run", "search", "resources", "tracking", "selection", "evaluation"]))
        leaves = {p: v for p, v in leaves.items() if p[0] != sec}
        leaves[(sec,)] = draw(VALUES)
    elif kind == "deep":
        n = draw(st.integers(10, 2000))
        value: Any = "x"
        for _ in range(n if n <= 200 else 200):
            value = [value]
        leaves[draw(st.sampled_from(KNOWN_PATHS))] = value
        if n > 200:
            return leaves, marks, f"name: {deep(n)}\n"
    elif kind == "alias" and len(leaves) >= 2:
        a, b = sorted(
            draw(st.lists(st.sampled_from(list(leaves)), min_size=2, max_size=2, unique=True)), key=list(leaves).index
        )
        if a[: len(b)] != b and b[: len(a)] != a:
            marks = {a: "&x", b: "*x"}
    elif kind == "bomb":
        return leaves, marks, f"run: {{seed: {alias_bomb(draw(st.integers(2, 12)), draw(st.integers(2, 9)))}}}\n"
    elif kind == "recursive":
        return leaves, marks, draw(st.sampled_from(["a: &a [*a]\n", "run: &r {train: *r}\n", "&a [*a]\n"]))
    elif kind == "raw":
        return leaves, marks, draw(st.one_of(hostile_text(200), YAML_ODD))
    return leaves, marks, None


@st.composite
def hostile_invocations(draw: Any, dry_run: bool = True) -> Invocation:
    """Valid pieces plus 1-4 hostile ones; with dry_run False, never a piece that starts anything."""
    args: list[str] = []
    files: list[tuple[str, bytes | None]] = [("dir", None), ("x", None)]
    if draw(st.booleans()):
        leaves = draw(valid_leaves())
        marks: dict[tuple, str] = {}
        raw = None
        if draw(st.booleans()):
            leaves, marks, raw = draw(config_mutation(leaves))
        if raw is None:
            style = draw(st.sampled_from(["flow", "block", "json"]))
            try:
                text = document(nest(leaves), style, marks)
            except ValueError:  # NaN in JSON
                text = document(nest(leaves), "flow", marks)
        else:
            text = raw
        data = text.encode("utf-8", "surrogatepass")
        corrupt = draw(st.integers(0, 9))
        if corrupt == 0 and data:  # a byte that is not UTF-8 somewhere
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.sampled_from([b"\xff", b"\xe9", b"\x00", b"\xc3", b"\xed\xa0\x80"])) + data[i:]
        elif corrupt == 1:
            data = draw(st.sampled_from([b"\xff\xfe", b"\xef\xbb\xbf", b""])) + data
        files.append(("cfg.yaml", data))
        args += ["--config", "cfg.yaml"]
    for path, value in draw(valid_leaves(max_size=3)).items():
        args += ["--set", set_pair(path, value)]
    pieces = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    for kind in pieces:
        if kind == 0:
            args += [draw(st.sampled_from(INT_FLAGS)), draw(st.one_of(NUMBER_TEXT, hostile_text()))]
        elif kind == 1:
            args += [draw(st.sampled_from(FLOAT_FLAGS)), draw(st.one_of(NUMBER_TEXT, hostile_text()))]
        elif kind == 2:
            flag = draw(st.sampled_from(STR_FLAGS))
            args += [flag, draw(uris() if flag != "--name" else hostile_text())]
        elif kind in (3, 4):
            key = draw(KEY_TEXT)
            args += ["--set", f"{key}={draw(YAML_VALUE_TEXT)}" if draw(st.integers(0, 9)) else key]
        elif kind == 5:
            args += ["--set", f"{'.'.join(draw(st.sampled_from(URI_FIELDS)))}={json.dumps(draw(uris()))}"]
        elif kind == 6:
            args += ["--config", draw(CONFIG_PATHS)]
        else:
            odd = draw(ODD_ARGS)
            if dry_run or odd not in ("--cluster", "--resume"):
                args.append(odd)
    if dry_run:
        if draw(st.booleans()):
            args.append(draw(st.sampled_from(["--cluster", "--verbose", "--resume"])))
        args.insert(0, "--dry-run")
    else:
        args += draw(schema_error())
    return Invocation(tuple(argv_safe(a) for a in args), tuple(files))


@st.composite
def schema_error(draw: Any) -> list[str]:
    """Arguments, placed last, that the schema refuses whatever came before: the run stops at validation."""
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return ["--num-samples", str(draw(st.integers(-(2**70), 0)))]
    if kind == 1:
        return ["--max-concurrent", str(draw(st.integers(-(2**70), 0)))]
    if kind == 2:
        return ["--seed", str(draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32))))]
    if kind == 3:
        return ["--cpus-per-trial", draw(st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e-9", "-0.0"]))]
    if kind == 4:  # an unknown top-level key
        key = "unknown_" + draw(hostile_text(20)).replace("=", "").replace(".", "")
        return ["--set", f"{key}={draw(YAML_VALUE_TEXT)}"]
    if kind == 5:  # a name the schema refuses: a character outside [A-Za-z0-9_.-], or too long
        name = draw(st.one_of(hostile_text(), NAME)) + draw(st.sampled_from([" ", "\u202e", "😀", "/", "x" * 101]))
        return ["--name", name if not name.startswith("-") else "x" + name]
    if kind == 6:
        path = ".".join(draw(st.sampled_from([p for p in KNOWN_PATHS if p[-1] in ("epochs", "num_samples", "seed")])))
        return ["--set", f"{path}={draw(st.sampled_from(['true', 'false', '[1]', '{a: 1}', 'x', '1.5', '-3']))}"]
    return [
        "--set",
        f"{draw(st.sampled_from(['run.train', 'search', 'resources.max_failures']))}.epochz={draw(YAML_VALUE_TEXT)}",
    ]


# --------------------------------------------------------------------------- the tests


def _settings(kind: str, slow: bool) -> settings:
    return settings(
        max_examples=EXAMPLES[kind][1 if slow else 0],
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


PROFILES = [pytest.param(False, id="fast"), pytest.param(True, id="slow", marks=pytest.mark.slow)]


def _report(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture, record_property: Callable, stats: Stats):
    record_property("cases", stats.cases)
    record_property("max_exit2_s", round(stats.max_exit2_s, 3))
    with capsys.disabled():
        print(f"\n{stats.line(request.node.name)}")


@pytest.mark.parametrize("slow", PROFILES)
def test_valid_invocations_dry_run_exit_0(slow, base, request, capsys, record_property):
    """Generated valid configs, --set pairs and flags: a dry run accepts them (exit 0), prints the config."""
    stats = Stats()

    @_settings("valid", slow)
    @given(valid_invocations())
    def prop(inv: Invocation) -> None:
        check_invocation(inv, base, stats, expect_rc=(0,))

    try:
        prop()
    finally:
        _report(request, capsys, record_property, stats)


@pytest.mark.parametrize("slow", PROFILES)
def test_hostile_invocations_dry_run(slow, base, request, capsys, record_property):
    """Generated hostile configs, --set pairs, flags and URIs (with --dry-run): exit 0 or 2, short stderr."""
    stats = Stats()

    @_settings("hostile", slow)
    @given(hostile_invocations(dry_run=True))
    def prop(inv: Invocation) -> None:
        check_invocation(inv, base, stats)

    try:
        prop()
    finally:
        _report(request, capsys, record_property, stats)


@pytest.mark.parametrize("slow", PROFILES)
def test_schema_errors_without_dry_run_exit_2(slow, base, request, capsys, record_property):
    """Without --dry-run, a case that holds a value the schema refuses stops at validation: exit 2, nothing written."""
    stats = Stats()

    @_settings("no_dry_run", slow)
    @given(hostile_invocations(dry_run=False))
    def prop(inv: Invocation) -> None:
        assert "--dry-run" not in inv.args
        check_invocation(inv, base, stats, expect_rc=(2,))

    try:
        prop()
    finally:
        _report(request, capsys, record_property, stats)
