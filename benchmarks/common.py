"""What the benchmark scripts share: paths, argument and command-line helpers, timestamps and the
host description, mean ± std formatting, timing, result-file writing, the reproduction settings
and the one-trainer run of a worker process.

Scripts import it as ``from benchmarks.common import ...`` and run from the repository root as modules
(``python -m benchmarks.perf.<name>``, ``python -m benchmarks.studies <study>``), which puts the root on
sys.path: ``benchmarks`` is not an installed package (the wheel ships calib_core and sweeps only).
Nothing here imports torch or calib_core at module level, so importing it is cheap.
"""

from __future__ import annotations

import gzip
import json
import math
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
# the pre-registered protocols, beside the studies that follow them
PROTOCOLS = ROOT / "benchmarks" / "studies" / "protocols"


def protocol_path(recorded: str | Path) -> Path:
    """A protocol file named as a result file or another protocol records it (relative to the repository root).
    Records made before issue #33 item 4 name benchmarks/protocols/, where the protocols were: found by file name."""
    path = ROOT / recorded
    return path if path.is_file() else PROTOCOLS / Path(recorded).name


# ------------------------------------------------------------------------------------------
# the reproduction settings (benchmarks/studies/reproduce.py; reproduce_mtl.py reuses the MNIST-1D
# ones so that their numbers are comparable)
# ------------------------------------------------------------------------------------------
# Settings chosen so that plain CE is over-confident at the end of training (see the table
# headers for the numbers that check it): small training splits, large val/test splits (so the
# ECE estimate is not dominated by its finite-sample floor), constant lr, no weight decay, long
# training relative to the data.
SETTINGS: dict[str, dict[str, Any]] = {
    "mnist1d": {
        "data": {"name": "mnist1d", "num_samples": 3000, "val_fraction": 0.2, "test_fraction": 0.4},
        "model": {"name": "cnn1d"},
        "train": {
            "epochs": 25,
            "batch_size": 64,
            "optimizer": "adam",
            "lr": 1e-2,
            "lr_schedule": "none",
            "weight_decay": 0.0,
        },
    },
    "digits": {
        "data": {"name": "digits", "val_fraction": 0.3, "test_fraction": 0.3},
        "model": {"name": "mlp"},
        "train": {
            "epochs": 60,
            "batch_size": 32,
            "optimizer": "adam",
            "lr": 1e-2,
            "lr_schedule": "none",
            "weight_decay": 0.0,
        },
    },
}
# what --quick overrides in SETTINGS (smoke runs: tiny data, 3 epochs)
QUICK: dict[str, dict[str, Any]] = {
    "mnist1d": {"data": {"num_samples": 1000}, "train": {"epochs": 3}},
    "digits": {"train": {"epochs": 3}},
}


def merge(base: dict, extra: dict) -> dict:
    """A deep copy of `base` with `extra` merged in (nested dicts merge, everything else replaces)."""
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


# ------------------------------------------------------------------------------------------
# arguments, command line, output directory, time stamps, host
# ------------------------------------------------------------------------------------------
def float_list(text: str) -> list[float]:
    """Floats of a comma-separated argument such as "1e-3,1e-2" (empty items skipped)."""
    return [float(x) for x in text.split(",") if x]


def command_line(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """The command that reruns `script` (pass `__file__`) with `argv` (default: sys.argv[1:]), for report headers:
    `python -m benchmarks.<...>` for a module of this package (run from the repository root), else `python <path>`."""
    args = [shlex.quote(a) for a in (list(argv) if argv is not None else sys.argv[1:])]
    rel = Path(os.path.relpath(Path(script).resolve(), ROOT))
    if rel.parts[0] == "benchmarks" and rel.suffix == ".py":
        return " ".join(["python -m", ".".join(rel.with_suffix("").parts), *args])
    return " ".join(["python", shlex.quote(str(rel)), *args])


def out_dir(given: Path | None, quick: bool = False, prefix: str = "bench_quick_") -> Path:
    """The output directory, created: `given`, else a fresh temp dir for --quick runs, else benchmarks/results."""
    path = given or (Path(tempfile.mkdtemp(prefix=prefix)) if quick else RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def utc_now() -> str:
    """The current UTC time to the second, as raw JSON records it ("2026-01-31 12:34:56")."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def utc_minute() -> str:
    """The current UTC time to the minute, as report headers print it ("2026-01-31 12:34 UTC")."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def host_info() -> dict[str, Any]:
    """The machine a raw JSON was measured on: platform, Python version, CPU count."""
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count()}


def host_line() -> str:
    """The machine in words for a report header ("Linux-...-x86_64, 2 CPUs")."""
    return f"{platform.platform()}, {os.cpu_count()} CPUs"


# ------------------------------------------------------------------------------------------
# statistics and formatting
# ------------------------------------------------------------------------------------------
def mean_std(vals: Iterable[float | None]) -> tuple[float, float]:
    """Mean and sample std of the finite values (std 0 for one value, (nan, nan) for none)."""
    kept = [v for v in vals if v is not None and math.isfinite(v)]
    if not kept:
        return float("nan"), float("nan")
    return statistics.fmean(kept), (statistics.stdev(kept) if len(kept) > 1 else 0.0)


def fmt_mean_std(m: float, s: float, scale: float = 1.0, nd: int = 2) -> str:
    """ "m ± s" times `scale` with `nd` decimals, "n/a" when the mean is not finite."""
    if not math.isfinite(m):
        return "n/a"
    return f"{m * scale:.{nd}f} ± {s * scale:.{nd}f}"


def reading(d: tuple[float, float], better_low: bool) -> str:
    """ "better" / "worse" for a (mean, std) difference whose |mean| exceeds its std, else "~" ("n/a" if undefined)."""
    m, s = d
    if not math.isfinite(m):
        return "n/a"
    if abs(m) <= s:
        return "~"
    return "better" if ((m < 0) if better_low else (m > 0)) else "worse"


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `fn`, after one untimed warm-up call."""
    fn()  # warm-up: imports, allocator, compiling or loading kernels
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------
# result files
# ------------------------------------------------------------------------------------------
def json_path(path: Path) -> Path:
    """A result JSON named as `X.json`: that file, or `X.json.gz` beside it when only the gzipped form exists (the
    large results are stored gzipped, issue #31: `benchmarks/results` under 15 MB)."""
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    return gz if not path.is_file() and path.suffix == ".json" and gz.is_file() else path


def read_json(path: Path) -> Any:
    """The content of a JSON file (a raw result to resume from or rebuild tables from); `X.json` is read from
    `X.json.gz` when only that exists, and a `.gz` name is read gzipped."""
    path = json_path(path)
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


def write_json(path: Path, obj: Any, compact: bool = False) -> None:
    """Write `obj` as JSON (indent 1, or compact); values JSON cannot hold are written as str. A name ending in
    `.json.gz` is written gzipped (mtime 0, so the same content gives the same bytes), and a plain `.json` of the
    same name beside it, which `read_json` would read first, is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, separators=(",", ":"), default=str) if compact else json.dumps(obj, indent=1, default=str)
    if path.name.endswith(".json.gz"):
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        path.with_name(path.name[: -len(".gz")]).unlink(missing_ok=True)
    else:
        path.write_text(text)


def write_text(path: Path, text: str) -> None:
    """Write a report (Markdown) file, creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ------------------------------------------------------------------------------------------
# runs in worker processes
# ------------------------------------------------------------------------------------------
def spawn_pool(workers: int) -> Pool:
    """A pool of `workers` fresh ("spawn") processes, each replaced after 50 runs."""
    # spawn, not fork: every run starts from a clean interpreter (torch threads, no inherited state)
    return mp.get_context("spawn").Pool(workers, maxtasksperchild=50)


def cpu_run_setup(seed: int, config: dict[str, Any]) -> tuple[Any, Any]:
    """One torch thread; the validated RunConfig (CPU, 1 thread, `seed`) of `config` and its dataset."""
    import torch

    torch.set_num_threads(1)
    from calib_core.config import RunConfig
    from calib_core.data import load_dataset

    cfg = RunConfig.model_validate({"seed": seed, "device": "cpu", "num_threads": 1, **config})
    return cfg, load_dataset(cfg.data, cfg.seed)


def run_trainer(job: dict[str, Any]) -> dict[str, Any]:
    """One training run of `job` ({dataset, key, group, seed, cal_lr, config}) on one CPU thread; errors are results too."""
    from calib_core.trainer import Trainer

    cfg, data = cpu_run_setup(job["seed"], job["config"])
    t0 = time.perf_counter()
    try:
        res = Trainer(cfg, data, "cpu").fit()
        out = {
            "status": res.status,
            "reason": res.reason,
            "epochs_run": res.epochs_run,
            "val": res.val_metrics,
            "test": res.test_metrics,
            "calibrator_info": res.calibrator_info,
            "median_epoch_time": statistics.median(res.epoch_times) if res.epoch_times else None,
            "final_train_loss": res.history[-1]["train_loss"] if res.history else None,
        }
    except Exception as exc:  # a crash is a result too: report it, keep the matrix going
        out = {
            "status": "error",
            "reason": f"{type(exc).__name__}: {exc}",
            "val": {},
            "test": {},
            "calibrator_info": {},
        }
    out["wall_s"] = time.perf_counter() - t0
    return {**{k: job[k] for k in ("dataset", "key", "group", "seed")}, "cal_lr": job.get("cal_lr"), **out}


def run_summary(run: dict[str, Any]) -> str:
    """'status acc=0.1234 ece=0.0123' of a finished run, for progress lines."""
    te = run.get("test") or {}
    return f"{run['status']} acc={te.get('accuracy', float('nan')):.4f} ece={te.get('ece', float('nan')):.4f}"
