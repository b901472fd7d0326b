"""Bad data stops a sweep before anything is written (issue #34 item 3), for the file formats and plugin datasets:
each case runs `python sweeps/launch.py --config c.yaml` in its own temporary folder and must end with exit 2, one
`error:` line on stderr naming the file (or the dataset) and the problem, and no file created (no mlflow.db,
optuna.db or ray_results). The launches run a few at a time in one fixture (each spends seconds importing)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calib_core.data.files import available_memory
from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"
PARALLEL = 3


def _png(path: Path, value: int = 0, size: tuple[int, int] = (6, 6)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*size, 3), value, dtype=np.uint8)).save(path)


def _images(d: Path, classes: dict[str, int]) -> None:
    for name, n in classes.items():
        (d / "img" / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            _png(d / "img" / name / f"{i}.png", 10 * i)


def _table(d: Path, name: str = "t.csv", **columns: Any) -> None:
    import pandas as pd

    df = pd.DataFrame(columns)
    (df.to_csv(d / name, index=False) if name.endswith(".csv") else df.to_parquet(d / name))


def _labels(n: int = 20) -> list[str]:
    return ["yes", "no"] * (n // 2)


PLUGIN = """
import numpy as np
import torch
from calib_core.data import DataSplits, Split, register_dataset

def _splits(x, y, name):
    s = Split(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y))
    return DataSplits(s, s, s, num_classes=2, input_shape=(3,), name=name)

@register_dataset("plugin_raises")
def raises(cfg, seed):
    import pandas as pd
    return pd.DataFrame({"a": [1]})["label"]  # KeyError: the label column is missing

@register_dataset("plugin_nan")
def nan(cfg, seed):
    x = np.ones((10, 3)); x[4, 1] = np.nan
    return _splits(x, np.arange(10) % 2, "plugin_nan")

@register_dataset("plugin_range")
def out_of_range(cfg, seed):
    return _splits(np.ones((10, 3)), np.arange(10) % 3, "plugin_range")

@register_dataset("plugin_one_class")
def one_class(cfg, seed):
    return _splits(np.ones((10, 3)), np.zeros(10, dtype=np.int64), "plugin_one_class")
"""


def _plugin(d: Path) -> None:
    (d / "bad_plugin.py").write_text(PLUGIN)


def _arrays(d: Path, x: np.ndarray, y: np.ndarray) -> None:
    np.savez(d / "a.npz", x=x, y=y)


def _sparse(d: Path) -> None:
    with open(d / "big.csv", "wb") as fh:
        fh.truncate(available_memory())  # sparse: no disk used; 6x this in memory is more than there is


IMG = {"name": "image_folder", "path": "img"}
TAB = {"name": "table", "path": "t.csv", "label_column": "y"}
ARR = {"name": "arrays", "path": "a.npz"}
NAN_X = np.where(np.arange(60).reshape(20, 3) == 7, np.nan, 1.0)

# case id -> (make the files, the run's data config, plugins, what the error line must contain)
CASES: dict[str, tuple[Callable[[Path], None], dict[str, Any], list[str], list[str]]] = {
    "folder_missing": (lambda d: None, IMG, [], ["image_folder:", "/img does not exist"]),
    "folder_empty": (lambda d: (d / "img").mkdir(), IMG, [], ["/img has no class sub-folders"]),
    "class_without_images": (
        lambda d: (_images(d, {"cat": 4}), (d / "img" / "dog").mkdir()),
        IMG,
        [],
        ["class folder(s) dog under", "/img hold no images"],
    ),
    "single_class": (lambda d: _images(d, {"cat": 6}), IMG, [], ["/img has a single class (cat)"]),
    "image_does_not_decode": (
        lambda d: (_images(d, {"cat": 5, "dog": 5}), (d / "img" / "dog" / "broken.png").write_bytes(b"not a png")),
        IMG,
        [],
        ["cannot decode", "/img/dog/broken.png", "UnidentifiedImageError"],
    ),
    "file_missing": (lambda d: None, TAB, [], ["table:", "/t.csv does not exist"]),
    "file_empty": (lambda d: (d / "t.csv").write_bytes(b""), TAB, [], ["/t.csv is empty"]),
    "column_not_in_table": (
        lambda d: _table(d, a=range(20), y=_labels()),
        {**TAB, "feature_columns": ["a", "dose"]},
        [],
        ["column 'dose' (data.feature_columns) is not in", "/t.csv, which has 2 columns: a, y"],
    ),
    "label_column_not_in_table": (
        lambda d: _table(d, a=range(20), y=_labels()),
        {**TAB, "label_column": "outcome"},
        [],
        ["column 'outcome' (data.label_column) is not in", "/t.csv"],
    ),
    "labels_not_integers": (
        lambda d: _table(d, a=range(20), y=[0.5, 1.0] * 10),
        TAB,
        [],
        ["labels in", "/t.csv are not integers", "0.5"],
    ),
    "table_single_class": (
        lambda d: _table(d, a=range(20), y=["yes"] * 20),
        TAB,
        [],
        ["/t.csv has a single class (yes)"],
    ),
    "table_nan": (
        lambda d: _table(d, "t.parquet", a=[1.0, np.nan] + [2.0] * 18, y=_labels()),
        {**TAB, "path": "t.parquet"},
        [],
        ["column 'a' of", "/t.parquet has 1 empty (NaN) cells (the first in row 1)", "data.missing: impute_mean"],
    ),
    "table_inf": (
        lambda d: _table(d, a=[1.0, np.inf] + [2.0] * 18, y=_labels()),
        TAB,
        [],
        ["column 'a' of", "/t.csv has NaN or inf values in 1 rows"],
    ),
    "table_categorical": (
        lambda d: _table(d, a=range(20), c=["red", "blue"] * 10, y=_labels()),
        TAB,
        [],
        ["/t.csv has non-numeric column 'c' (values like 'red'); set data.categorical: onehot"],
    ),
    "table_free_text": (
        lambda d: _table(d, a=range(30), note=[f"said {i} things" for i in range(30)], y=_labels(30)),
        TAB,
        [],
        [
            "/t.csv has free-text column 'note' (over 20 distinct",
            "set data.text_columns: drop or onehot (allowed: reject, drop, onehot), or list data.feature_columns",
        ],
    ),
    "label_column_typo": (
        lambda d: _table(d, age=range(20), outcome=_labels()),
        {**TAB, "label_column": "outcom"},
        [],
        ["column 'outcom' (data.label_column; did you mean 'outcome'?) is not in", "which has 2 columns: age, outcome"],
    ),
    "table_too_large": (
        _sparse,
        {**TAB, "path": "big.csv"},
        [],
        ["/big.csv is too large for memory: it needs about", "GiB are available"],
    ),
    "arrays_labels_out_of_range": (
        lambda d: _arrays(d, np.ones((20, 3)), np.arange(20) % 2 - 1),
        ARR,
        [],
        ["/a.npz lie outside [0, 1): min -1, max 0"],
    ),
    "arrays_labels_not_integers": (
        lambda d: _arrays(d, np.ones((20, 3)), np.linspace(0, 1, 20)),
        ARR,
        [],
        ["labels in", "/a.npz are not integers"],
    ),
    "arrays_class_without_examples": (
        lambda d: _arrays(d, np.ones((20, 3)), np.arange(20) % 2 * 2),
        ARR,
        [],
        ["/a.npz has no examples of class(es) 1 (classes 0..2)"],
    ),
    "arrays_nan": (
        lambda d: _arrays(d, NAN_X, np.arange(20) % 2),
        ARR,
        [],
        ["/a.npz has NaN or inf features in 1 rows (the first is row 2)"],
    ),
    "arrays_no_y": (
        lambda d: np.savez(d / "a.npz", x=np.ones((4, 2))),
        ARR,
        [],
        ["/a.npz has no labels array named y, target, labels (its arrays: x); set data.y_key"],
    ),
    "arrays_two_feature_keys": (
        lambda d: np.savez(d / "a.npz", x=np.ones((20, 2)), X=np.ones((20, 2)), y=np.arange(20) % 2),
        ARR,
        [],
        ["/a.npz has several features arrays (x, X); set data.x_key to one of them"],
    ),
    "torchvision_root_empty": (
        lambda d: (d / "empty").mkdir(),
        {"name": "cifar10", "root": "empty"},
        [],
        ["cifar10", "/empty", "cifar-10-batches-py/data_batch_1"],
    ),
    "plugin_raises": (
        _plugin,
        {"name": "plugin_raises"},
        ["bad_plugin"],
        ["run.data.name: loading dataset 'plugin_raises' failed: KeyError: 'label'"],
    ),
    "plugin_nan": (
        _plugin,
        {"name": "plugin_nan"},
        ["bad_plugin"],
        ["dataset 'plugin_nan': train features hold NaN or inf in 1 rows (the first is row 4)"],
    ),
    "plugin_labels_out_of_range": (
        _plugin,
        {"name": "plugin_range"},
        ["bad_plugin"],
        ["dataset 'plugin_range': train labels lie outside [0, 2): min 0, max 2"],
    ),
    "plugin_single_class": (
        _plugin,
        {"name": "plugin_one_class"},
        ["bad_plugin"],
        ["dataset 'plugin_one_class': the train split holds a single class"],
    ),
}


def _config(data: dict[str, Any], plugins: list[str]) -> str:
    import yaml

    return yaml.safe_dump(
        {
            "name": "bad-data",
            "plugins": plugins,
            "run": {"data": data, "model": {"name": "mlp"}, "train": {"epochs": 1}},
            "search": {"num_samples": 1},
        }
    )


# launched on every test run (one per format and a plugin); the rest are marked slow
FAST = ("image_does_not_decode", "column_not_in_table", "arrays_labels_out_of_range", "plugin_raises")


def _launch_all(cases: list[str], root: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path, set[str]]]:
    """Launch `cases` (PARALLEL at a time): case -> (finished process, its folder, the files made for it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "CALIB_PLUGINS")}
    pending = []
    for case in cases:
        make, data, plugins, _ = CASES[case]
        d = root / case
        d.mkdir()
        make(d)
        (d / "c.yaml").write_text(_config(data, plugins))
        pending.append((case, d, {p.name for p in d.iterdir()}))
    out: dict[str, tuple[subprocess.CompletedProcess, Path, set[str]]] = {}
    running: list[tuple[str, Path, set[str], subprocess.Popen, float]] = []
    while pending or running:
        while pending and len(running) < PARALLEL:
            case, d, made = pending.pop(0)
            proc = subprocess.Popen(
                [sys.executable, str(LAUNCH), "--config", "c.yaml"],
                cwd=d,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "PYTHONPATH": os.pathsep.join([str(d), env.get("PYTHONPATH", "")])},
            )
            running.append((case, d, made, proc, time.monotonic()))
        case, d, made, proc, started = running.pop(0)
        stdout, stderr = proc.communicate(timeout=max(1.0, 300 - (time.monotonic() - started)))
        out[case] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), d, made)
    return out


@pytest.fixture(scope="module")
def fast_launches(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path, set[str]]]:
    return _launch_all(list(FAST), tmp_path_factory.mktemp("fast"))


@pytest.fixture(scope="module")
def slow_launches(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path, set[str]]]:
    return _launch_all([c for c in CASES if c not in FAST], tmp_path_factory.mktemp("slow"))


def _check_launch(result: tuple[subprocess.CompletedProcess, Path, set[str]], case: str) -> None:
    proc, d, made = result
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: run.data"), proc.stderr[-3000:]
    for part in CASES[case][3]:
        assert part in lines[0], lines[0]
    assert {p.name for p in d.iterdir()} == made  # no mlflow.db, optuna.db, ray_results


@pytest.mark.parametrize("case", FAST)
def test_bad_data_stops_the_launch_with_one_line_exit_2_and_nothing_written(fast_launches, case):
    _check_launch(fast_launches[case], case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c not in FAST])
def test_every_bad_data_case_stops_the_launch_with_one_line_exit_2_and_nothing_written(slow_launches, case):
    _check_launch(slow_launches[case], case)


@pytest.mark.parametrize("case", list(CASES))
def test_the_pre_run_check_gives_each_bad_data_case_its_line(tmp_path, monkeypatch, case):
    """The same cases through the check the launch runs (sweeps/checks/model_fit.py: the job the launch builds
    from the config, run in this process)."""
    import calib_core.plugins
    from calib_core.registry import DATASETS
    from sweeps.checks.model_fit import job_for, run_job
    from sweeps.config import load_sweep_config

    make, data, plugins, parts = CASES[case]
    make(tmp_path)
    (tmp_path / "c.yaml").write_text(_config(data, plugins))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        answer = run_job(job_for(load_sweep_config(tmp_path / "c.yaml")))
    finally:  # the plugin's datasets leave the registry with it
        if plugins:
            for name in [n for n in DATASETS.names(builtin=False) if n.startswith("plugin_")]:
                DATASETS.remove(name)
            sys.modules.pop("bad_plugin", None)
            if "bad_plugin" in calib_core.plugins._loaded:
                calib_core.plugins._loaded.remove("bad_plugin")
    line = answer.get("error", "")
    assert line.startswith("run.data") and "\n" not in line, answer
    for part in parts:
        assert part in line, line


def test_a_config_error_of_the_file_formats_is_one_line_naming_the_field(tmp_path):
    """Values are checked with the config (also by --dry-run): a field of another format, a missing path."""
    for data, message in [
        ({"name": "table", "path": "t.csv"}, "data.label_column must be set for table"),
        ({"name": "arrays"}, "data.path must be set for arrays"),
        ({"name": "table", "path": "t.csv", "label_column": "y", "image_size": 32}, "data.image_size applies to"),
        ({"name": "image_folder", "path": "img", "categorical": "maybe"}, "categorical: Input should be 'onehot' or"),
        ({"name": "mnist1d", "path": "x.csv"}, "data.path applies to image_folder, table, arrays only"),
    ]:
        (tmp_path / "c.yaml").write_text(_config(data, []))
        proc = subprocess.run(
            [sys.executable, str(LAUNCH), "--config", "c.yaml", "--dry-run"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]
