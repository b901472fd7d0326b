"""Temperature scaling on top of a trained model (any method: one-go, CE, post-hoc), fitted on validation.

The reference users compare a calibrated classifier against is "the same backbone plus temperature scaling on
validation" (Guo et al. 2017). Fitted on all validation rows, the validation metrics of the result would be
in-sample and useless for choosing between models; so the validation predictions here are k-fold cross-fitted
(each fold calibrated by a temperature fitted on the other folds, folds seeded per task), and the test
predictions use the temperature fitted on all validation rows (the one a deployed model carries).

Multi-task: one temperature per task, fitted on the task's labelled rows (labels (N, T), -1 = missing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import Tensor, nn

from calib_core.calibrators import fit_posthoc
from calib_core.calibrators.temperature import TemperatureScaling
from calib_core.trainer.calibrator_batches import kfold_indices
from calib_core.trainer.posthoc import crossfit

# logits (one tensor per task), labels, num_bins -> metrics (TaskStrategy.metrics)
MetricsFn = Callable[[list[Tensor], Tensor, int], dict[str, float]]


@dataclass(frozen=True)
class TemperatureOnTop:
    """Per task: the temperature fitted on all validation rows, the cross-fitted validation logits and the test
    logits divided by that temperature (rows without a label keep the full fit's logits)."""

    temperatures: list[float]
    val_logits: list[Tensor]
    test_logits: list[Tensor]


class TemperatureOnTopModel(nn.Module):
    """A calibrated model whose output logits (one tensor, or one per task) are divided by fitted temperatures:
    the exported form of "trial + TS". The temperatures are a buffer, so they travel in the state_dict."""

    def __init__(self, inner: nn.Module, temperatures: list[float]) -> None:
        super().__init__()
        if not temperatures or not all(t > 0 and math.isfinite(t) for t in temperatures):
            raise ValueError(f"temperatures must be finite and > 0, got {temperatures}")
        self.inner = inner
        self.register_buffer("temperatures", torch.tensor([float(t) for t in temperatures]))

    def forward(self, x: Tensor) -> Tensor | list[Tensor]:
        out = self.inner(x)
        temps = cast("Tensor", self.temperatures)  # a registered buffer
        if isinstance(out, (list, tuple)):
            return [z / temps[t].to(z.dtype) for t, z in enumerate(out)]
        return out / temps[0].to(out.dtype)


def _task_rows(labels: Tensor, t: int) -> tuple[Tensor | None, Tensor]:
    if labels.dim() == 1:
        return None, labels
    rows = (labels[:, t] >= 0).nonzero().flatten()
    return rows, labels[rows, t]


def fit_temperature_on_top(
    val_logits: list[Tensor], val_labels: Tensor, test_logits: list[Tensor], *, folds: int = 5, seed: int = 0
) -> TemperatureOnTop:
    """Fit one temperature per task on its labelled validation rows; cross-fitted validation logits, test logits."""
    if len(val_logits) != len(test_logits):
        raise ValueError(f"{len(val_logits)} validation outputs but {len(test_logits)} test outputs")
    temps, val_out, test_out = [], [], []
    for t, (zv, zt) in enumerate(zip(val_logits, test_logits)):
        if zv.dim() != 2 or zt.dim() != 2 or zv.shape[1] != zt.shape[1]:
            raise ValueError(f"logits must be (N, K) with one K: got {tuple(zv.shape)} and {tuple(zt.shape)}")
        if not (bool(torch.isfinite(zv).all()) and bool(torch.isfinite(zt).all())):
            raise ValueError(f"non-finite logits of task {t}: temperature scaling on top needs finite logits")
        zv, zt = zv.detach().float().cpu(), zt.detach().float().cpu()
        rows, y = _task_rows(val_labels.cpu(), t)
        x = zv if rows is None else zv[rows]
        cal = TemperatureScaling(zv.shape[1])
        k = min(folds, len(x))
        if k < 2:  # nothing (or one row) to fit on: the identity, said by its temperature of 1
            temps.append(1.0)
            val_out.append(zv)
            test_out.append(zt)
            continue
        init = {name: v.clone() for name, v in cal.state_dict().items()}
        fold_idx = kfold_indices(len(x), k, seed + 7919 * t)
        z_rows = crossfit(cal, init, x, y.long(), fold_idx, fit_posthoc)  # leaves cal fitted on all rows
        with torch.no_grad():
            z_val = cal(zv)
            if rows is None:
                z_val = z_rows
            else:
                z_val[rows] = z_rows
            val_out.append(z_val)
            test_out.append(cal(zt))
        temps.append(float(cal.temperature.detach()))
    return TemperatureOnTop(temps, val_out, test_out)


def _prediction_view(val: list[Tensor], test: list[Tensor], val_y: Tensor, test_y: Tensor) -> Any:
    """What calib_core.evaluation.prediction_arrays reads from a result, for the on-top predictions."""
    view = SimpleNamespace()
    for split, logits, y in (("val", val, val_y), ("test", test, test_y)):
        probs = [torch.softmax(z, dim=1) for z in logits]
        if y.dim() == 1:
            setattr(view, f"{split}_probs", probs[0])
            setattr(view, f"{split}_labels", y)
        else:  # multi-task: the first task's labelled rows as the single-task view, as the trainer's result
            keep = y[:, 0] >= 0
            setattr(view, f"{split}_probs", probs[0][keep])
            setattr(view, f"{split}_labels", y[keep, 0])
            setattr(view, f"task_{split}_probs", probs)
            setattr(view, f"task_{split}_labels", y)
    return view


def temperature_on_top_scores(
    result: Any,
    data: Any,
    metrics_fn: MetricsFn,
    *,
    folds: int = 5,
    seed: int = 0,
    num_bins: int = 15,
    debiased: tuple[str, ...] = (),
) -> tuple[TemperatureOnTop, dict[str, dict[str, float]], dict[str, Any]]:
    """A finished run's model plus temperature scaling on validation: the fit, its metrics per split ('val'
    cross-fitted, 'test' with the full fit; `metrics_fn`'s metrics and the `debiased` estimators) and its
    prediction arrays (calib_core.evaluation.prediction_arrays' layout)."""
    from calib_core.evaluation import debiased_scores, prediction_arrays

    def logits(x: Tensor) -> list[Tensor]:
        with torch.no_grad():
            out = result.model.predict_logits(x)
        return out if isinstance(out, list) else [out]

    val_y, test_y = data.val.y.cpu(), data.test.y.cpu()
    fit = fit_temperature_on_top(logits(data.val.x), val_y, logits(data.test.x), folds=folds, seed=seed)
    tasks = getattr(data, "tasks", None)
    arrays = prediction_arrays(
        _prediction_view(fit.val_logits, fit.test_logits, val_y, test_y), [str(t[0]) for t in tasks] if tasks else None
    )
    metrics = {
        "val": metrics_fn(fit.val_logits, val_y, num_bins),
        "test": metrics_fn(fit.test_logits, test_y, num_bins),
    }
    for split in ("val", "test"):
        metrics[split].update(debiased_scores(arrays, split, debiased))
    return fit, metrics, arrays


__all__ = ["TemperatureOnTop", "TemperatureOnTopModel", "fit_temperature_on_top", "temperature_on_top_scores"]
