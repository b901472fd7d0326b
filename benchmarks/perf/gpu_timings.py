"""The in-process timings of the GPU acceptance run (benchmarks/perf/gpu_acceptance.py, parts b and e).

- `time_metrics`: calib_core's metrics, the streaming accumulator and the paired bootstrap on one device, side by
  side with torchmetrics on the same device and the same tensors (round-robin repeats, medians).
- `time_training`: one epoch of ResNet-18 on CIFAR-shaped fabricated data, one-go against plain CE, and one epoch of
  a torchvision ResNet-50 loaded from a fabricated weights file, frozen and fine-tuned.

Every row is a dict {"what", "figure", "command", "seconds"}: the figure as read, the call that produced it.
CUDA work is synchronised before each clock read, so a figure is the work's time, not its launch's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

Row = dict[str, Any]


# ------------------------------------------------------------------------------------------
# sizes
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSizes:
    """Problem sizes of part (b)."""

    n: int = 10**6
    k: int = 100
    chunk: int = 10**4
    boot_n: int = 10**4
    boot_k: int = 10
    resamples: int = 1000
    repeats: int = 5


@dataclass(frozen=True)
class TrainSizes:
    """Problem sizes of part (e): CIFAR-10's train split and 224-pixel ImageNet-shaped inputs on the device."""

    r18_shape: tuple[int, int, int] = (3, 32, 32)
    r18_rows: tuple[int, int, int] = (50_000, 5_000, 5_000)  # train, val, test
    r18_batch: int = 128
    r50_shape: tuple[int, int, int] = (3, 224, 224)
    r50_rows: tuple[int, int, int] = (2_560, 256, 256)
    r50_batch: int = 64
    epochs: int = 2  # the first epoch warms cuDNN and the allocator; the last is the figure
    r18_kwargs: tuple[tuple[str, Any], ...] = ()  # run.model.kwargs of the ResNet-18 (the dry run narrows it)


# tiny sizes for the dry run on CPU: the same code paths in a few seconds
TINY_METRICS = MetricSizes(n=2_000, k=10, chunk=500, boot_n=500, boot_k=10, resamples=20, repeats=2)
TINY_TRAIN = TrainSizes(
    r18_shape=(3, 8, 8),
    r18_rows=(32, 16, 16),
    r18_batch=16,
    r50_shape=(3, 32, 32),
    r50_rows=(16, 8, 8),
    r50_batch=8,
    epochs=1,
    r18_kwargs=(("base_width", 8),),
)


# ------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def side_by_side(contenders: dict[str, Callable[[], Any]], device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds of each contender: one warm-up call each, then `repeats` rounds timing each in turn."""
    for fn in contenders.values():
        fn()  # warm-up: kernels loaded or compiled, allocator primed
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):  # round-robin: a burst of load hits every contender alike
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _row(what: str, seconds: float, command: str, ratio_to: float | None = None) -> Row:
    figure = f"{1000 * seconds:.2f} ms"
    if ratio_to:
        figure += f" ({seconds / ratio_to:.2f}x ours)"
    return {"what": what, "figure": figure, "command": command, "seconds": seconds}


# ------------------------------------------------------------------------------------------
# part (b): metrics, streaming, bootstrap against torchmetrics
# ------------------------------------------------------------------------------------------
def _probs(n: int, k: int, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 softmax of N(0, 3^2) logits and labels equal to the argmax 60 % of the time, on `device`."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g) * 3.0
    pred = logits.argmax(1)
    labels = torch.where(torch.rand(n, generator=g) < 0.6, pred, torch.randint(0, k, (n,), generator=g))
    return torch.softmax(logits, 1).to(device), labels.to(device)


def _one_shot_rows(s: MetricSizes, device: torch.device) -> list[Row]:
    """ECE and MCE against torchmetrics' multiclass_calibration_error; ACE and all metrics at once (ours only)."""
    from torchmetrics.functional.classification import multiclass_calibration_error as tm_ce

    import calib_core.metrics as M

    p, y = _probs(s.n, s.k, device, seed=1)
    on = f"N={s.n:,} K={s.k} float32 on {device.type}"
    fns: dict[str, Callable[[], Any]] = {
        "ece": lambda: M.ece(p, y, num_bins=15),
        "tm_ece": lambda: tm_ce(p, y, num_classes=s.k, n_bins=15, norm="l1"),
        "mce": lambda: M.mce(p, y, num_bins=15),
        "tm_mce": lambda: tm_ce(p, y, num_classes=s.k, n_bins=15, norm="max"),
        "ace": lambda: M.ace(p, y, num_bins=15),
        "all": lambda: M.compute_all(p, y),
    }
    t = side_by_side(fns, device, s.repeats)
    gap = abs(float(fns["ece"]()) - float(fns["tm_ece"]()))
    return [
        _row("ECE, calib_core", t["ece"], f"calib_core.metrics.ece(p, y, num_bins=15), {on}"),
        _row(
            "ECE, torchmetrics",
            t["tm_ece"],
            f"torchmetrics multiclass_calibration_error(p, y, num_classes={s.k}, n_bins=15, norm='l1'), {on}",
            t["ece"],
        ),
        _row("MCE, calib_core", t["mce"], f"calib_core.metrics.mce(p, y, num_bins=15), {on}"),
        _row("MCE, torchmetrics", t["tm_mce"], f"multiclass_calibration_error(..., norm='max'), {on}", t["mce"]),
        _row("ACE, calib_core (no torchmetrics counterpart)", t["ace"], f"calib_core.metrics.ace(p, y), {on}"),
        _row("all metrics, calib_core", t["all"], f"calib_core.metrics.compute_all(p, y), {on}"),
        {
            "what": "ECE difference, ours vs torchmetrics",
            "figure": f"{gap:.2e}",
            "command": f"the two ECE calls above, {on}",
            "gap": gap,
        },
    ]


def _streaming_rows(s: MetricSizes, device: torch.device) -> list[Row]:
    """CalibrationAccumulator against torchmetrics' MulticlassCalibrationError module, fed the same logit chunks."""
    from torchmetrics.classification import MulticlassCalibrationError

    import calib_core.metrics as M

    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(s.n, s.k, generator=g) * 3.0).to(device)
    y = torch.randint(0, s.k, (s.n,), generator=g).to(device)
    chunks = [(logits[i : i + s.chunk], y[i : i + s.chunk]) for i in range(0, s.n, s.chunk)]

    def ours() -> float:
        acc = M.CalibrationAccumulator(s.k, num_bins=15, from_logits=True, device=device)
        for z, t in chunks:
            acc.update(z, t)
        return float(acc.compute()["ece"])

    def theirs() -> float:
        metric = MulticlassCalibrationError(num_classes=s.k, n_bins=15, norm="l1").to(device)
        for z, t in chunks:
            metric.update(z, t)  # logits: torchmetrics applies the softmax itself
        return float(metric.compute())

    t = side_by_side({"ours": ours, "theirs": theirs}, device, s.repeats)
    gap = abs(ours() - theirs())
    on = f"N={s.n:,} K={s.k} logits in chunks of {s.chunk:,} on {device.type}"
    return [
        _row(
            # the accumulator bins every class column too (classwise ECE) and sums NLL and Brier on each update:
            # the whole family, where torchmetrics keeps the top-label confidences alone
            "streaming, calib_core (the whole family: top-label and classwise bins, NLL, Brier)",
            t["ours"],
            f"CalibrationAccumulator(K, 15, from_logits=True).update x chunks, {on}",
        ),
        _row(
            "streaming ECE, torchmetrics (top-label ECE only)",
            t["theirs"],
            f"MulticlassCalibrationError(num_classes={s.k}, n_bins=15).update x chunks, {on}",
            t["ours"],
        ),
        {"what": "streaming ECE difference, ours vs torchmetrics", "figure": f"{gap:.2e}", "command": on, "gap": gap},
    ]


def _bootstrap_rows(s: MetricSizes, device: torch.device) -> list[Row]:
    """Our paired bootstrap (counts drawn once, on the device) against torchmetrics' BootStrapper of ECE."""
    from torchmetrics.classification import MulticlassCalibrationError
    from torchmetrics.wrappers import BootStrapper

    import calib_core.metrics as M

    p, y = _probs(s.boot_n, s.boot_k, device, seed=3)
    counts = M.resample_counts(s.boot_n, s.resamples, seed=0, device=device)

    def theirs() -> Any:
        base = MulticlassCalibrationError(num_classes=s.boot_k, n_bins=15, norm="l1")
        boot = BootStrapper(base, num_bootstraps=s.resamples, sampling_strategy="multinomial").to(device)
        boot.update(p, y)
        return boot.compute()

    fns = {
        "ece": lambda: M.bootstrap_metrics(p, y, counts, names=("ece",)),
        "all": lambda: M.bootstrap_metrics(p, y, counts),
        "theirs": theirs,
    }
    t = side_by_side(fns, device, s.repeats)
    on = f"B={s.resamples} N={s.boot_n:,} K={s.boot_k} on {device.type}"
    return [
        _row("bootstrap ECE, calib_core", t["ece"], f"bootstrap_metrics(p, y, counts, names=('ece',)), {on}"),
        _row("bootstrap all metrics, calib_core", t["all"], f"bootstrap_metrics(p, y, counts), {on}"),
        _row(
            "bootstrap ECE, torchmetrics",
            t["theirs"],
            f"BootStrapper(MulticlassCalibrationError(...), num_bootstraps={s.resamples}, "
            f"sampling_strategy='multinomial'), {on}",
            t["ece"],
        ),
    ]


def time_metrics(device: torch.device, sizes: MetricSizes) -> list[Row]:
    """Part (b): the one-shot metrics, streaming and bootstrap rows."""
    return _one_shot_rows(sizes, device) + _streaming_rows(sizes, device) + _bootstrap_rows(sizes, device)


# ------------------------------------------------------------------------------------------
# part (e): ResNet-18 one-go vs CE, torchvision ResNet-50 frozen vs fine-tuned
# ------------------------------------------------------------------------------------------
def fabricated_splits(shape: tuple[int, ...], rows: tuple[int, int, int], num_classes: int, name: str) -> Any:
    """DataSplits of N(0, 1) images with random labels (every class present), CIFAR-style crop-and-flip on."""
    from calib_core.data.splits import CropFlip, DataSplits, Split

    g = torch.Generator().manual_seed(0)

    def split(n: int) -> Split:
        y = torch.arange(n) % num_classes  # every class present, whatever n
        return Split(torch.randn(n, *shape, generator=g), y[torch.randperm(n, generator=g)])

    train, val, test = (split(n) for n in rows)
    return DataSplits(
        train=train,
        val=val,
        test=test,
        num_classes=num_classes,
        input_shape=tuple(shape),
        name=name,
        augmentation=CropFlip(padding=4, flip=True),
    )


def _epoch_row(what: str, cfg: Any, data: Any, device: torch.device, command: str, model: nn.Module | None) -> Row:
    """Train `cfg.train.epochs` epochs; the last epoch's seconds (train and validation pass) is the figure."""
    from calib_core.trainer import Trainer

    trainer = Trainer(cfg, data, device, model=model)
    result = trainer.fit()
    if result.status != "completed":
        raise RuntimeError(f"{what}: {result.status}: {result.reason}")
    first, last = result.epoch_times[0], result.epoch_times[-1]
    n = len(data.train)
    figure = f"{last:.2f} s/epoch ({n / last:,.0f} img/s; first epoch {first:.2f} s)"
    return {"what": what, "figure": figure, "command": command, "seconds": last, "first_epoch_s": first}


def _run_config(
    model: dict[str, Any], method: str, batch: int, epochs: int, device: torch.device, lr: float = 1e-3
) -> Any:
    from calib_core.config import RunConfig

    train = {"method": method, "epochs": epochs, "batch_size": batch, "lr": lr, "lr_schedule": "none"}
    if method == "onego":
        train |= {"calibrator": "temperature", "calibrator_data": "holdout:0.1"}
    return RunConfig.model_validate({"seed": 0, "device": device.type, "model": model, "train": train})


def resnet18_rows(device: torch.device, s: TrainSizes) -> list[Row]:
    """ResNet-18 (calib_core's CIFAR-style), one epoch of one-go (temperature) and of plain CE on the same data."""
    data = fabricated_splits(s.r18_shape, s.r18_rows, 10, "fabricated CIFAR-shaped")
    shape = "x".join(map(str, s.r18_shape))
    rows = []
    for method, label in (("onego", "one-go (temperature, holdout 0.1)"), ("ce", "plain CE")):
        cfg = _run_config({"name": "resnet18", "kwargs": dict(s.r18_kwargs)}, method, s.r18_batch, s.epochs, device)
        command = (
            f"Trainer(RunConfig(model=resnet18{''.join(f' {k}={v}' for k, v in s.r18_kwargs)}, train.method={method}, batch_size={s.r18_batch}, "
            f"epochs={s.epochs}), {s.r18_rows[0]:,} fabricated {shape} images, crop+flip).fit() on {device.type}"
        )
        rows.append(_epoch_row(f"ResNet-18 epoch, {label}", cfg, data, device, command, None))
    rows.append(
        {
            "what": "ResNet-18 one-go / plain CE",
            "figure": f"{rows[0]['seconds'] / rows[1]['seconds']:.2f}x",
            "command": "the two rows above",
        }
    )
    return rows


def fabricated_resnet50_weights(folder: Path) -> Path:
    """A torchvision ResNet-50 state dict with random weights, saved as a pretrained file would be."""
    from torchvision.models import resnet50

    torch.manual_seed(0)
    path = folder / "resnet50_fabricated.pt"
    torch.save(resnet50(weights=None).state_dict(), path)
    return path


def _torchvision_resnet50(num_classes: int, input_shape: tuple[int, ...], weights: Path, frozen: bool) -> nn.Module:
    """torchvision's ResNet-50 as a calib_core Classifier (features = everything before fc, a fresh head), with
    the file loaded through calib_core's checks (fc dropped: 1000 classes) and, frozen, calib_core's freeze."""
    from torchvision.models import resnet50

    from calib_core.models.classifier import Classifier
    from calib_core.models.pretrained import check_state_dict, freeze_backbone, read_state_dict

    class TorchvisionResNet50(Classifier):
        def __init__(self) -> None:
            super().__init__(num_classes, input_shape)
            self.body = resnet50(weights=None)
            self.body.fc = nn.Identity()  # type: ignore[assignment]  # the head is ours
            self._make_head(2048)

        def features(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    net = TorchvisionResNet50()
    sd = {f"body.{k}": v for k, v in read_state_dict(weights).items() if not k.startswith("fc.")}
    check_state_dict(net, sd, str(weights))
    net.load_state_dict(sd, strict=False)  # the head's keys start fresh
    return freeze_backbone(net) if frozen else net


def project_has(name: str) -> bool:
    """Whether calib_core builds the model `name` (registered, or a torchvision/<arch> name it resolves)."""
    from calib_core.models import get_model_class

    try:
        get_model_class(name)
    except ValueError:
        return False
    return True


def _resnet50_pass(device: torch.device, s: TrainSizes, data: Any, weights: Path, via_project: bool) -> list[Row]:
    """Frozen and fine-tuned epochs, the model built by calib_core (`via_project`) or from torchvision here."""
    shape = "x".join(map(str, s.r50_shape))
    rows = []
    for freeze, label in (("head_only", "frozen (head only)"), ("none", "fine-tuned")):
        spec = {"name": "torchvision/resnet50", "weights": str(weights), "freeze": freeze}
        cfg = _run_config(spec, "onego", s.r50_batch, s.epochs, device)
        model = None if via_project else _torchvision_resnet50(10, s.r50_shape, weights, freeze == "head_only")
        command = (
            f"Trainer(RunConfig(model={{name: torchvision/resnet50, weights: <fabricated file>, freeze: {freeze}}}, "
            f"onego temperature, batch_size={s.r50_batch}, epochs={s.epochs}), {s.r50_rows[0]:,} fabricated "
            f"{shape} images{'' if via_project else ', model built by torchvision'}).fit() on {device.type}"
        )
        rows.append(_epoch_row(f"ResNet-50 epoch, {label}", cfg, data, device, command, model))
    return rows


def resnet50_rows(device: torch.device, s: TrainSizes) -> tuple[list[Row], str]:
    """One epoch of one-go training on a torchvision ResNet-50 from a fabricated weights file, frozen (head only)
    and fine-tuned; (rows, how the model was built). calib_core's `torchvision/resnet50` when it exists; if that
    path fails, its error is a row and torchvision builds the model here."""
    data = fabricated_splits(s.r50_shape, s.r50_rows, 10, "fabricated ImageNet-shaped")
    direct = (
        "built with torchvision directly: torchvision.models.resnet50 as a calib_core Classifier, the file read and "
        "checked by calib_core.models.pretrained"
    )
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-r50-") as d:
        weights = fabricated_resnet50_weights(Path(d))
        if not project_has("torchvision/resnet50"):
            rows = _resnet50_pass(device, s, data, weights, False)
            return rows, f"{direct} (calib_core.models has no torchvision/resnet50 yet)"
        try:
            rows = _resnet50_pass(device, s, data, weights, True)
            return rows, "run.model.name torchvision/resnet50 (calib_core's model path)"
        except Exception as exc:  # noqa: BLE001 - the project's path failing is a finding; time the model anyway
            error = {
                "what": "ResNet-50 by run.model.name torchvision/resnet50",
                "figure": "failed: " + " ".join(f"{type(exc).__name__}: {exc}".split())[:300],
                "command": "Trainer(RunConfig(model={name: torchvision/resnet50, weights: <fabricated file>})).fit()",
            }
            rows = [error, *_resnet50_pass(device, s, data, weights, False)]
            return rows, f"{direct} (calib_core's torchvision/resnet50 failed: see the first row)"
