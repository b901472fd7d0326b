"""Does the backbone take the dataset's inputs? Build it for the dataset's input shape and run one dummy batch
of two rows on the CPU, so that a model/data mismatch (resnet18 on 1-D signals) is one line before the sweep,
not an error in every trial.

The check imports torch (seconds, and hundreds of MB the driver does not need until selection), so preflight
runs it in a child process started first (`start`) and waits for it last (`ModelFitCheck.result`): it overlaps
with the other checks, and the driver stays free of torch while the trials run. `python -m
sweeps.checks.model_fit '<json>'` is that child: it prints one JSON line, {"params": N} or {"error": "..."}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError, clip

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

TIMEOUT_S = 300.0


def measure(model: dict[str, Any], data_name: str, plugins: list[str]) -> dict[str, Any]:
    """{"params": parameter count} when the model takes the data, {"error": one line} when not, {} when the
    dataset's shape is only known once it is loaded (plugins, config-dependent shapes: the trials find out)."""
    if plugins:
        from calib_core.plugins import load_plugins

        load_plugins(plugins)
    from calib_core.data.registry import dataset_shape

    shape = dataset_shape(data_name)
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
        return {
            "error": f"run.model.name: {model['name']!r} cannot take {data_name}'s inputs of shape {input_shape}: "
            f"{clip(first, 160)}"
        }
    if tuple(out.shape) != (2, num_classes):
        return {
            "error": f"run.model.name: {model['name']!r} gives outputs of shape {tuple(out.shape)[1:]} for "
            f"{data_name}, which has {num_classes} classes"
        }
    return {"params": sum(p.numel() for p in net.parameters())}


class ModelFitCheck:
    """The check running in a child process; `result()` waits for it."""

    def __init__(self, cfg: SweepConfig) -> None:
        self._job: dict[str, Any] = {
            "model": cfg.run.model.model_dump(mode="json"),
            "data": cfg.run.data.name,
            "plugins": list(cfg.plugins),
        }
        self._proc: subprocess.Popen[str] | None = None
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
        if self._proc is None:  # no child: the check runs here
            answer = measure(self._job["model"], self._job["data"], self._job["plugins"])
            if "error" in answer:
                raise ConfigError(answer["error"])
            return answer.get("params")
        try:
            out, err = self._proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.cancel()
            raise ConfigError(f"run.model.name: building the model took over {TIMEOUT_S:.0f} s") from None
        finally:
            self._proc = None
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            tail = " ".join(err.split())[-200:]
            raise ConfigError(f"run.model.name: the model/data check failed: {tail or 'no output'}")
        answer = json.loads(lines[-1])
        if "error" in answer:
            raise ConfigError(answer["error"])
        return answer.get("params")

    def cancel(self) -> None:
        """Stop the child (an earlier check failed)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()
        self._proc = None


def start(cfg: SweepConfig) -> ModelFitCheck:
    """Start the check in a child process."""
    return ModelFitCheck(cfg)


def main(argv: list[str] | None = None) -> int:
    """The child: one JSON line on stdout."""
    job = json.loads((argv if argv is not None else sys.argv[1:])[0])
    print(json.dumps(measure(job["model"], job["data"], job.get("plugins", []))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
