"""Does the backbone take the dataset's inputs? Build it for the dataset's input shape and run one dummy batch
of two rows on the CPU, so that a model/data mismatch (resnet18 on 1-D signals) is one line before the sweep,
not an error in every trial.

The same child loads the dataset first when its shape or its contents cannot be trusted without reading it (the
file formats image_folder / table / arrays, plugin datasets, and any run with pretrained weights) and checks the
splits (calib_core/data/checks.py: classes, label range, NaN/inf), and loads `run.model.weights` into the model
(calib_core/models/pretrained.py): a missing file, a column not in the table, an image that does not decode, a
table too large for memory or a checkpoint that does not fit is one line before anything is written. With
`--cluster` only what is reachable from this machine is read (the trials find out about the rest).

The check imports torch (seconds, and hundreds of MB the driver does not need until selection), so preflight
runs it in a child process started first (`start`) and waits for it last (`ModelFitCheck.result`): it overlaps
with the other checks, and the driver stays free of torch while the trials run. `python -m
sweeps.checks.model_fit '<json>'` is that child: it prints one JSON line, {"params": N} or {"error": "..."}.

A passed check whose answer depends on nothing but the job and the code (a model without weights on an embedded
dataset's declared shape, no plugin, no file read) is kept in the cache folder (calib_core/cache_dir.py, `model-fit/`)
under a digest of the job, calib_core's and this module's source and the versions of Python, torch, torchvision and
timm; the same check later is answered from it without a child (~2 s of CPU, most of the start-up's checks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError, clip

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

TIMEOUT_S = 300.0


def _data_error(name: str, exc: BaseException) -> str:
    """A loader's or a check's failure as one line: a ValueError says what (and names the file) already."""
    from calib_core.data.files import DataError

    first = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, DataError):
        return f"run.data: {first}"  # the loaders' own lines: lists already shortened, the advice at the end kept
    if isinstance(exc, ValueError):
        return f"run.data: {clip(first, 260)}"
    return f"run.data.name: loading dataset {name!r} failed: {type(exc).__name__}: {clip(first, 200)}"


def measure(
    model: dict[str, Any],
    data_name: str,
    plugins: list[str],
    data: dict[str, Any] | None = None,
    seed: int = 0,
    weights: bool = True,
    files: str | None = None,
) -> dict[str, Any]:
    """{"params": parameter count} when the model takes the data, {"error": one line} when not, {} when the
    dataset's shape is only known once it is loaded and `data` (the run's data config, to load it with `seed`)
    is not given: the trials find out. `weights`: load `model["weights"]` (when set) and check it fits. `files`:
    the data root of a dataset read from torchvision's files (CIFAR, SVHN, MNIST, CelebA), checked for presence."""
    if plugins:
        from calib_core.plugins import load_plugins

        load_plugins(plugins)
    from calib_core.data.registry import dataset_shape

    shape = dataset_shape(data_name)
    multitask = False
    if files is not None:
        problem = _missing_files(data_name, files)
        if problem:
            return {"error": problem}
    if data is not None:
        from calib_core.data import load_dataset
        from calib_core.data.checks import check_splits

        try:
            splits = load_dataset(data, seed)
            check_splits(splits)
        except Exception as exc:  # noqa: BLE001 - a plugin's loader may raise anything: one line, not a traceback
            return {"error": _data_error(data_name, exc)}
        multitask = splits.tasks is not None
        classes = splits.tasks[0][1] if splits.tasks else splits.num_classes
        shape = (tuple(int(s) for s in splits.input_shape), int(classes))
        del splits
    if shape is None:
        return {}
    import torch

    from calib_core.models import create_model

    input_shape, num_classes = shape
    try:
        net = create_model(model["name"], num_classes, input_shape, **model.get("kwargs", {})).eval()
        with torch.no_grad():
            out = net(torch.zeros(2, *input_shape))
    except Exception as exc:  # noqa: BLE001 - any failure is the mismatch to report
        first = " ".join(str(exc).split()) or type(exc).__name__
        if first.startswith("run.model."):  # the builder's own line (an unknown architecture, its kwargs, channels)
            return {"error": first}
        return {
            "error": f"run.model.name: {model['name']!r} cannot take {data_name}'s inputs of shape {input_shape}: "
            f"{clip(first, 160)}"
        }
    if tuple(out.shape) != (2, num_classes):
        return {
            "error": f"run.model.name: {model['name']!r} gives outputs of shape {tuple(out.shape)[1:]} for "
            f"{data_name}, which has {num_classes} classes"
        }
    if model.get("weights") and multitask:
        return {"error": f"run.model.weights: applies to single-task datasets; {data_name} has several tasks"}
    if model.get("weights") and weights:
        from calib_core.models import build_model

        try:
            loaded = build_model(model, num_classes, input_shape).eval()
            with torch.no_grad():
                loaded(torch.zeros(2, *input_shape))
        except Exception as exc:  # noqa: BLE001 - the file's own problem, said in one line
            first = " ".join(str(exc).split()) or type(exc).__name__
            # our own lines are short by construction (lists shortened, never the advice): not clipped
            own = first.startswith("run.model.")
            return {"error": first if own else clip(f"run.model.weights: {type(exc).__name__}: {first}", 280)}
        problem = _trainer_ignores_weights(model, loaded, num_classes, input_shape)
        if problem:
            return {"error": problem}
    return _sizes(net, model)


def _sizes(net: Any, model: dict[str, Any]) -> dict[str, int]:
    """{"params": every parameter a checkpoint keeps, frozen or not, "trainable": those the optimizer keeps moments
    of (the head alone under freeze=head_only: calib_core.models.pretrained.freeze_backbone)}."""
    import torch

    total = sum(p.numel() for p in net.parameters())
    head = getattr(net, "head", None)
    if model.get("freeze") == "head_only" and isinstance(head, torch.nn.Module):
        return {"params": total, "trainable": sum(p.numel() for p in head.parameters())}
    return {"params": total, "trainable": total}


def _trainer_ignores_weights(
    model: dict[str, Any], loaded: Any, num_classes: int, input_shape: tuple[int, ...]
) -> str | None:
    """A line when the trainer's own model builder (calib_core/trainer/single_task.py) would not apply the
    weights or the freeze that `loaded` (calib_core.models.build_model) has: a sweep must not train from scratch
    while the config says pretrained."""
    from types import SimpleNamespace

    import torch

    from calib_core.config import RunConfig
    from calib_core.trainer import SingleTask

    run = RunConfig.model_validate({"model": model})
    net = SingleTask(num_classes, loss_fn=None).create_model(run, SimpleNamespace(input_shape=input_shape))  # type: ignore[arg-type]
    want, got = loaded.state_dict(), net.state_dict()
    same = set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want if not k.startswith("head."))
    frozen = [n for n, _ in loaded.named_parameters()] == [n for n, _ in net.named_parameters()]
    if same and frozen:
        return None
    return (
        "run.model.weights: this trainer does not apply run.model.weights / run.model.freeze yet (its "
        "calib_core/trainer/single_task.py create_model must call calib_core.models.build_model); refusing to "
        "train from scratch"
    )


def _missing_files(name: str, root: str) -> str | None:
    """A line naming what is missing under the data root of a torchvision set or CelebA (presence only: the
    loaders compare checksums and parse the files in the trials)."""
    from calib_core.data import celeba, torchvision_sets

    base = Path(root).expanduser().absolute()
    if name in torchvision_sets.SPECS:
        missing = torchvision_sets.missing_files(torchvision_sets.SPECS[name], base)
    elif name == "celeba":
        missing = celeba.missing_files(base)
    else:
        return None
    if not missing:
        return None
    rel = [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in missing]
    shown = ", ".join(rel[:2]) + (f" (and {len(rel) - 2} more)" if len(rel) > 2 else "")
    return (
        f"run.data.root: {name}: {base} lacks {shown}; place torchvision's files there or set run.data.download: true"
    )


def _reachable(path: str | None) -> bool:
    return bool(path) and Path(str(path)).expanduser().exists()


def _root_to_check(cfg: SweepConfig, cluster: bool) -> str | None:
    """The data root whose files the check looks for: a local run of a dataset read from a root, not downloaded."""
    from calib_core.registry import DATASETS

    d = cfg.run.data
    if cluster or d.download or d.root is None or d.name not in DATASETS or not DATASETS.meta(d.name)["needs_root"]:
        return None
    return d.root


def loads_data(cfg: SweepConfig, cluster: bool = False) -> bool:
    """Whether the check loads the dataset: the file formats, plugin datasets and runs with pretrained weights,
    never a download (it would write), and with `--cluster` only data this machine can read."""
    from calib_core.config import FILE_FIELDS
    from calib_core.registry import DATASETS

    d = cfg.run.data
    if d.download:
        return False
    embedded = d.name in DATASETS.names(builtin=True) and d.name not in FILE_FIELDS
    if embedded and not cfg.run.model.weights:
        return False  # the shape is declared, the contents are ours; torchvision sets and CelebA check their files
    if not cluster:
        return True
    if d.path is not None:
        return _reachable(d.path)
    if d.root is not None:
        return _reachable(d.root)
    return embedded and not DATASETS.meta(d.name)["needs_root"]


def job_for(cfg: SweepConfig, cluster: bool = False) -> dict[str, Any]:
    """What the child checks for `cfg` (a JSON-able dict; `run_job` runs it)."""
    weights = cfg.run.model.weights
    return {
        "model": cfg.run.model.model_dump(mode="json"),
        "data": cfg.run.data.name,
        "plugins": list(cfg.plugins),
        "data_config": cfg.run.data.model_dump(mode="json") if loads_data(cfg, cluster) else None,
        "seed": cfg.run.seed,
        "weights": bool(weights) and (not cluster or _reachable(weights)),
        "files": _root_to_check(cfg, cluster),
    }


def cacheable(job: dict[str, Any]) -> bool:
    """Whether the job's answer depends on the job and the code alone: no plugin, no data, weights or files read."""
    return not job["plugins"] and job["data_config"] is None and not job["weights"] and job["files"] is None


def _code_digest() -> str:
    """SHA-256 of calib_core's Python source and this module's (what builds the model and measures it)."""
    import hashlib

    import calib_core

    h = hashlib.sha256()
    for path in [*sorted(Path(calib_core.__file__).parent.rglob("*.py")), Path(__file__)]:
        h.update(str(path.name).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_path(job: dict[str, Any]) -> Path | None:
    """Where a passed check of `job` is kept; None when the job is not cacheable or the cache is off."""
    import hashlib
    import platform
    from importlib import metadata

    from calib_core.cache_dir import cache_root

    root = cache_root()
    if root is None or not cacheable(job):
        return None

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "none"

    versions = [platform.python_version(), *(version(p) for p in ("torch", "torchvision", "timm"))]
    # the seed draws the weights, not their shapes: one answer for every seed
    what = json.dumps({k: v for k, v in job.items() if k != "seed"}, sort_keys=True)
    key = hashlib.sha256("\n".join([what, *versions, _code_digest()]).encode()).hexdigest()[:32]
    return root / "model-fit" / f"{key}.json"


def _counted(answer: Any) -> bool:
    """Whether `answer` is a passed check's ({"params": N, "trainable": M}): the only answers kept or trusted."""
    return isinstance(answer, dict) and all(isinstance(answer.get(k), int) for k in ("params", "trainable"))


def _read_answer(path: Path | None) -> dict[str, Any] | None:
    """A kept answer, or None when there is none readable."""
    if path is None:
        return None
    try:
        answer = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return answer if _counted(answer) else None


def _keep_answer(path: Path | None, answer: dict[str, Any]) -> None:
    """Keep a passed check's answer; a disk that refuses is no error."""
    from calib_core.cache_dir import write_whole

    if path is None or not _counted(answer):
        return
    kept = json.dumps({"params": answer["params"], "trainable": answer["trainable"]}).encode()
    try:
        write_whole(path, lambda f: f.write(kept))
    except OSError:
        pass


class ModelFitCheck:
    """The check running in a child process, or answered from the cache; `result()` waits for it."""

    def __init__(self, cfg: SweepConfig, cluster: bool = False) -> None:
        self._job = job_for(cfg, cluster)
        self._proc: subprocess.Popen[str] | None = None
        self.trainable: int | None = None  # the parameters the optimizer trains, once result() answered
        self._cache = cache_path(self._job)
        self.cached = _read_answer(self._cache)  # the answer kept from an earlier, identical check
        if self.cached is not None:
            return
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "sweeps.checks.model_fit", json.dumps(self._job)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        except OSError:  # the interpreter cannot be started again (e.g. a user who cannot read its path)
            self._proc = None

    def result(self) -> int | None:
        """The backbone's parameter count (None where the shape is not known before loading); raises ConfigError
        on a mismatch."""
        if self.cached is not None:
            self.trainable = self.cached["trainable"]
            return self.cached["params"]
        if self._proc is None:  # no child: the check runs here
            answer = run_job(self._job)
            if "error" in answer:
                raise ConfigError(answer["error"])
            _keep_answer(self._cache, answer)
            self.trainable = answer.get("trainable", answer.get("params"))
            return answer.get("params")
        try:
            out, err = self._proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.cancel()
            raise ConfigError(
                f"run.model.name: loading the data and building the model took over {TIMEOUT_S:.0f} s"
            ) from None
        finally:
            self._proc = None
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            tail = " ".join(err.split())[-200:]
            raise ConfigError(f"run.model.name: the model/data check failed: {tail or 'no output'}")
        answer = json.loads(lines[-1])
        if "error" in answer:
            raise ConfigError(answer["error"])
        _keep_answer(self._cache, answer)
        self.trainable = answer.get("trainable", answer.get("params"))
        return answer.get("params")

    def cancel(self) -> None:
        """Stop the child (an earlier check failed)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()
        self._proc = None


def start(cfg: SweepConfig, cluster: bool = False) -> ModelFitCheck:
    """Start the check in a child process."""
    return ModelFitCheck(cfg, cluster)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """`measure` of a `job_for` dict: {"params": N}, {"error": "..."} or {}."""
    return measure(
        job["model"],
        job["data"],
        job.get("plugins", []),
        data=job.get("data_config"),
        seed=int(job.get("seed", 0)),
        weights=bool(job.get("weights", True)),
        files=job.get("files"),
    )


def main(argv: list[str] | None = None) -> int:
    """The child: one JSON line on stdout."""
    job = json.loads((argv if argv is not None else sys.argv[1:])[0])
    print(json.dumps(run_job(job)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
