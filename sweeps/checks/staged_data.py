"""Pre-flight check of a cluster sweep's dataset: its files are under run.data.root (the shared data volume) or
a complete staged copy is where CALIB_DATASETS_URI says; otherwise the sweep is refused before any trial, in one
line naming the staging step (calib_core/data/staging.py, deploy/README.md "Stage the datasets").

`staged_data_problem` decides from what was read (pure); `check_cluster_data` reads it: which files are missing
under the root and the staged manifest, nothing written. With run.data.download the trials fetch the data
themselves (the opt-in component public-https-egress), so nothing is checked.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from calib_core.config import ConfigError, clip

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

READ_TIMEOUT_S = 20.0  # an object store that does not answer is a problem, not a hang
GUIDE = "deploy/README.md"


def staged_data_problem(name: str, root: str, missing: list[str], source: str | None, staged: str | None) -> str | None:
    """The refusal when `missing` files of dataset `name` are not under `root` and no complete staged copy is at
    `source` (`staged`: why the staged copy is unusable, None when it is complete); None when the sweep can run."""
    from calib_core.data.staging import SOURCE_ENV, stage_step

    if not missing or (source and staged is None):
        return None
    why = clip(staged or "", 70) if source else f"{SOURCE_ENV} is not set"
    # kept under the CLI's 300-character error line: the step is never cut
    return (
        f"run.data.root: {name} is neither under {root} ({len(missing)} files missing) nor staged ({why}); "
        f"stage it from a machine with internet access: `{stage_step(name, source)}` ({GUIDE})"
    )


def _staged_reason(source: str, name: str, files: tuple[str, ...], timeout: float) -> str | None:
    """Why the staged copy of `name` under `source` is unusable (read in a thread, at most `timeout` s)."""
    from calib_core.data import staging

    reason: list[str | None] = []

    def read() -> None:
        try:
            staging.read_manifest(source, name, files)
            reason.append(None)
        except FileNotFoundError:
            reason.append(f"no {staging.MANIFEST} in DEST/{name}/")  # the step below names DEST
        except Exception as exc:  # noqa: BLE001 - a store's failures come in many types; each is the reason
            reason.append(" ".join(str(exc).split()) or type(exc).__name__)

    worker = threading.Thread(target=read, name="staged-data-check", daemon=True)
    worker.start()
    worker.join(timeout)
    return reason[0] if reason else f"no answer within {timeout:g} s"


def check_cluster_data(cfg: SweepConfig, timeout: float = READ_TIMEOUT_S) -> None:
    """Refuse a cluster sweep whose torchvision dataset is neither under run.data.root nor staged."""
    from calib_core.data.staging import staged_source
    from calib_core.data.torchvision_sets import SPECS

    d = cfg.run.data
    if d.download or d.root is None or d.name not in SPECS:
        return
    root = Path(d.root).expanduser().absolute()
    missing = [rel for rel in SPECS[d.name].files if not (root / rel).is_file()]
    source = staged_source()
    staged = _staged_reason(source, d.name, SPECS[d.name].files, timeout) if missing and source else None
    problem = staged_data_problem(d.name, str(root), missing, source, staged)
    if problem:
        raise ConfigError(problem)
