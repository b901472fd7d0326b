"""Robustness evaluation of a trained model: calibration under dataset shift and OOD detection.

`predict_proba` is any callable x -> probabilities: a (N, K) tensor (single task; e.g.
`TrainResult.predict_proba`) or a list of (N, K_t) tensors (multi-task;
`MultiTaskTrainResult.predict_proba`). Multi-task labels are (N, T) with -1 = missing; each
task is scored on its labelled rows and the plain keys are means over tasks (per-task values
under `<task>_<key>` when the data names its tasks).

* `shift_metrics(predict_proba, data, seed)`: one row per (corruption, severity) of
  `calib_core.shift.shift_suite` on the test split: dict(corruption, severity, accuracy, ece).
* `mean_shift_ece(rows)`: the mean ECE over those rows.
* `ood_metrics(predict_proba, data_in, x_out)`: `calib_core.ood.ood_report` (MSP and entropy
  AUROC / FPR@95) with the in-distribution test split against OOD inputs `x_out`.
* `final_metrics(result, data, ...)`: what a finished run is scored on besides the trainer's own
  metrics, per split: the less biased calibration estimators, the shift means and the OOD scores,
  with the prediction arrays and the shift tables they came from (the sweep's trials report these).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calib_core.data.splits import DataSplits, Split
from calib_core.metrics import accuracy, ece
from calib_core.ood import ood_report
from calib_core.shift import SEVERITIES, shift_suite

ProbaFn = Callable[[Tensor], Any]


def _as_list(probs: Any) -> list[Tensor]:
    return [torch.as_tensor(p) for p in probs] if isinstance(probs, (list, tuple)) else [torch.as_tensor(probs)]


def _task_names(data: Any, n: int) -> list[str]:
    tasks = getattr(data, "tasks", None)
    return [str(t[0]) for t in tasks] if tasks else [f"task{i}" for i in range(n)]


def _scores(probs: Any, labels: Tensor, names: Sequence[str], num_bins: int) -> dict[str, float]:
    """accuracy and ece (means over tasks with labels; per task when there are several)."""
    plist = _as_list(probs)
    y = labels.cpu()
    ys = [y] if y.dim() == 1 else [y[:, t] for t in range(y.shape[1])]
    if len(ys) != len(plist):
        raise ValueError(f"predict_proba gave {len(plist)} output(s) for labels of shape {tuple(y.shape)}")
    per: dict[str, dict[str, float]] = {}
    for name, p, yt in zip(names, plist, ys):
        keep = yt >= 0
        if not bool(keep.any()):
            continue
        p = p.detach().float().cpu()[keep]
        per[name] = {"accuracy": float(accuracy(p, yt[keep])), "ece": float(ece(p, yt[keep], num_bins=num_bins))}
    if not per:
        raise ValueError("no labelled rows to score")
    out = {k: sum(m[k] for m in per.values()) / len(per) for k in ("accuracy", "ece")}
    if len(plist) > 1:
        out.update({f"{n}_{k}": v for n, m in per.items() for k, v in m.items()})
    return out


def shift_metrics(
    predict_proba: ProbaFn,
    data: DataSplits,
    seed: int,
    *,
    names: Sequence[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    num_bins: int = 15,
    split: str = "test",
) -> list[dict[str, Any]]:
    """[{corruption, severity, accuracy, ece (+ per-task keys)}] over a split's shift suite
    (`split="val"` for model selection, which must never look at the test split)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    rows = []
    source = getattr(data, split)
    for name, sev, split_x in shift_suite(source, seed, names=names, severities=severities, stats=data.stats):
        probs = predict_proba(split_x.x)
        n = len(_as_list(probs))
        rows.append(
            {"corruption": name, "severity": int(sev), **_scores(probs, split_x.y, _task_names(data, n), num_bins)}
        )
    return rows


def mean_shift_ece(rows: Sequence[dict[str, Any]]) -> float:
    """Mean ECE over the rows of `shift_metrics` (every corruption and severity weighted equally)."""
    if not rows:
        raise ValueError("no shift rows")
    return float(sum(float(r["ece"]) for r in rows) / len(rows))


def ood_metrics(
    predict_proba: ProbaFn, data_in: DataSplits | Split | Tensor, x_out: Tensor, *, tpr: float = 0.95
) -> dict[str, float]:
    """`ood_report` of the in-distribution inputs (a DataSplits' test split, a Split, or a
    tensor) against `x_out`. Multi-task: per task (`<task>_msp_auroc`, ...) and the means."""
    if isinstance(data_in, DataSplits):
        x_in = data_in.test.x
    elif isinstance(data_in, Split):
        x_in = data_in.x
    else:
        x_in = data_in
    p_in, p_out = _as_list(predict_proba(x_in)), _as_list(predict_proba(x_out))
    if len(p_in) != len(p_out):
        raise ValueError("predict_proba returned different numbers of tasks for in- and out-of-distribution inputs")
    reports = [ood_report(a.detach().float().cpu(), b.detach().float().cpu(), tpr=tpr) for a, b in zip(p_in, p_out)]
    if len(reports) == 1:
        return reports[0]
    names = _task_names(data_in, len(reports))
    out = {k: sum(r[k] for r in reports) / len(reports) for k in reports[0]}
    out.update({f"{n}_{k}": v for n, r in zip(names, reports) for k, v in r.items()})
    return out


OOD_KINDS = ("gaussian_noise", "permuted")


def make_ood_inputs(x: Tensor, kind: str, seed: int) -> Tensor:
    """Synthetic out-of-distribution inputs shaped like `x`, deterministic in `seed`.

    `gaussian_noise`: i.i.d. N(0, 1) in the standardised input space (matches the first two
    moments of standardised data, carries no signal). `permuted`: every input's values shuffled
    along its flattened features (keeps each input's value distribution, destroys its structure:
    the harder of the two).
    """
    if kind not in OOD_KINDS:
        raise ValueError(f"unknown OOD kind {kind!r}; allowed: {', '.join(OOD_KINDS)}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    if kind == "gaussian_noise":
        return torch.randn(tuple(x.shape), generator=gen, dtype=x.dtype).to(x.device)
    flat = x.reshape(x.shape[0], -1)
    order = torch.argsort(torch.rand(flat.shape, generator=gen), dim=1).to(x.device)
    return torch.gather(flat, 1, order).reshape(x.shape)


SPLITS = ("val", "test")


def prediction_arrays(result: Any, task_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """A run's validation and test predictions as arrays: `<split>_probs` / `<split>_labels`; for a
    multi-task run also `tasks`, `<split>_task_labels` (N, T; -1 = missing) and `<split>_task<t>_probs`."""
    arrays = {
        f"{split}_{what}": getattr(result, f"{split}_{what}").numpy()
        for split in SPLITS
        for what in ("probs", "labels")
    }
    if getattr(result, "task_val_probs", None) is not None:
        arrays["tasks"] = np.array([str(n) for n in (task_names or [])])
        for split in SPLITS:
            arrays[f"{split}_task_labels"] = getattr(result, f"task_{split}_labels").numpy()
            for t, probs in enumerate(getattr(result, f"task_{split}_probs")):
                arrays[f"{split}_task{t}_probs"] = probs.numpy()
    return arrays


def debiased_scores(arrays: dict[str, np.ndarray], split: str, names: Sequence[str]) -> dict[str, float]:
    """`calib_core.metrics.<name>` of a split's predictions (multi-task: the mean over tasks of each
    task's value on its labelled rows)."""
    from calib_core import metrics

    if "tasks" in arrays:
        labels = arrays[f"{split}_task_labels"]
        parts = [(arrays[f"{split}_task{t}_probs"], labels[:, t]) for t in range(labels.shape[1])]
    else:
        parts = [(arrays[f"{split}_probs"], arrays[f"{split}_labels"])]
    parts = [(p[y >= 0], y[y >= 0]) for p, y in parts if (y >= 0).any()]
    return {
        name: float(np.mean([float(getattr(metrics, name)(p.astype(np.float64), y)) for p, y in parts]))
        for name in names
    }


@dataclass(frozen=True)
class FinalEvaluation:
    """`final_metrics`' answer: metrics per split ({'val': {name: value}, 'test': ...}), the prediction
    arrays they were computed from, and the shift tables per split (empty without shift)."""

    metrics: dict[str, dict[str, float]]
    arrays: dict[str, np.ndarray]
    shift: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def final_metrics(
    result: Any,
    data: Any,
    *,
    seed: int,
    debiased: Sequence[str],
    num_bins: int = 15,
    shift: bool = False,
    shift_corruptions: Sequence[str] | None = None,
    shift_severities: Sequence[int] = SEVERITIES,
    ood: str = "none",
    ood_scores: Sequence[str] = ("msp", "entropy"),
) -> FinalEvaluation:
    """A finished run's scores beyond the trainer's metrics, on val (for selection) and test (the record):
    `debiased` estimators; with `shift`, `shift_ece` / `shift_accuracy` (means over the corruption suite);
    with `ood` (an OOD_KINDS name), `ood_<score>_<measure>` against synthetic inputs of each split's shape."""
    tasks = getattr(data, "tasks", None)
    arrays = prediction_arrays(result, [str(t[0]) for t in tasks] if tasks else None)
    metrics: dict[str, dict[str, float]] = {split: debiased_scores(arrays, split, debiased) for split in SPLITS}
    tables: dict[str, list[dict[str, Any]]] = {}
    with torch.no_grad():
        if shift:
            for split in SPLITS:
                rows = shift_metrics(
                    result.predict_proba,
                    data,
                    seed,
                    split=split,
                    names=shift_corruptions,
                    severities=shift_severities,
                    num_bins=num_bins,
                )
                tables[split] = rows
                metrics[split]["shift_ece"] = float(np.mean([r["ece"] for r in rows]))
                metrics[split]["shift_accuracy"] = float(np.mean([r["accuracy"] for r in rows]))
        if ood != "none":
            for i, split in enumerate(SPLITS):
                x_in = getattr(data, split).x
                x_out = make_ood_inputs(x_in, ood, seed=seed * 1000 + 17 + i)
                for k, v in ood_metrics(result.predict_proba, x_in, x_out).items():
                    if k.split("_")[0] in ood_scores:  # the means over tasks, not `<task>_<score>_...`
                        metrics[split][f"ood_{k}"] = float(v)
    return FinalEvaluation(metrics, arrays, tables)


__all__ = [
    "OOD_KINDS",
    "FinalEvaluation",
    "debiased_scores",
    "final_metrics",
    "make_ood_inputs",
    "mean_shift_ece",
    "ood_metrics",
    "prediction_arrays",
    "shift_metrics",
]
