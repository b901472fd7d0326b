"""What a trial's searched params mean (layer 1, pure: no ray, optuna or mlflow): the RunConfig they make of the
sweep's base run config, and the trial's short label. The trainable, the tracking callback, the progress output
and the driver's records all read trials through these, whichever integration sampled the params."""

from __future__ import annotations

from typing import Any

from calib_core.config import RunConfig, build_model


def resolve_run_config(base: RunConfig, params: dict[str, Any]) -> RunConfig:
    """Apply sampled params to the base run config (validated again, so bad combos fail early)."""
    raw = base.model_dump()
    choice = params.get("calibrator")
    train = raw["train"]
    if choice in ("none", "ce_es"):  # ce_es: its patience comes as train.early_stopping_patience
        train["method"] = "ce"
    elif isinstance(choice, str) and choice.startswith("posthoc_"):
        train["method"] = "posthoc"
        train["posthoc_calibrator"] = choice.removeprefix("posthoc_")
    elif choice is not None:
        train["method"] = "onego"
        train["calibrator"] = choice
        if "calibrator_lr" in params:
            train["calibrator_lr"] = float(params["calibrator_lr"])
    for key, value in params.items():
        if "." not in key:
            continue
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return build_model(RunConfig, raw)


def describe_params(params: dict[str, Any]) -> str:
    """A short human label for a trial, e.g. 'last_layer lr=3.2e-03'."""
    label = str(params.get("calibrator", "?"))
    if label == "ce_es":
        label = "CE early stopping"
        params = {k: v for k, v in params.items() if k != "train.early_stopping_patience"}
    if "calibrator_lr" in params:
        label += f" lr={params['calibrator_lr']:.1e}"
    extras = [
        f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
        for k, v in params.items()
        if "." in k
    ]
    return " ".join([label, *extras])


def trial_label(trial: Any) -> str:
    """A Ray Tune trial's label (describe_params of its config); its id when the config cannot be described."""
    try:
        return describe_params(trial.config)
    except Exception:  # noqa: BLE001 - a label is never a reason to lose the line it is in
        return str(getattr(trial, "trial_id", "?"))
