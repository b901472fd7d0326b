"""Pre-flight check of a cluster sweep's dataset: its files are under run.data.root (the shared data volume) or
a complete staged copy is where CALIB_DATASETS_URI says; otherwise the sweep is refused before any trial, in one
line naming the staging step (calib_core/data/staging.py, deploy/README.md "Stage the datasets").

`staged_data_problem` decides from what was read (pure); `check_cluster_data` reads it: which files are missing
under the root and the staged manifest, nothing written; a store that does not answer yet (no connection, no
answer within READ_TIMEOUT_S) is waited for like the sweep's other stores (servers.wait_for). With
run.data.download the trials fetch the data themselves (the opt-in component public-https-egress), so nothing is
checked.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from calib_core.config import ConfigError, clip
from sweeps.checks.servers import wait_for

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

READ_TIMEOUT_S = 20.0  # one read of the manifest; a store that does not answer is waited for, then refused
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
            reason.append(
                _short_reason(" ".join(str(exc).split()) or type(exc).__name__, f"DEST/{name}/{staging.MANIFEST}")
            )

    import pyarrow.fs  # noqa: F401 - loaded here, so that the timeout measures the store, not an import

    worker = threading.Thread(target=read, name="staged-data-check", daemon=True)
    worker.start()
    worker.join(timeout)
    return reason[0] if reason else f"no answer within {timeout:g} s"


def _short_reason(text: str, manifest: str) -> str:
    """A store's error `text` in the few words the refusal line has room for: pyarrow's S3 error code (e.g.
    ACCESS_DENIED), or "cannot reach the store: ..." (transient: waited out) when it did not answer at all."""
    code = re.search(r"AWS Error (\w+)", text)
    if code and code.group(1) == "NETWORK_CONNECTION":  # no name, nothing listening, a timeout
        detail = text.split("Details: ", 1)[-1] if "Details: " in text else text.rsplit(": ", 1)[-1]
        return f"cannot reach the store: {clip(detail, 50)}"
    if code:
        return f"cannot read {manifest}: {code.group(1)}"
    return text


def check_cluster_data(cfg: SweepConfig, timeout: float = READ_TIMEOUT_S, wait_s: float | None = None) -> None:
    """Refuse a cluster sweep whose torchvision dataset is neither under run.data.root nor staged; a store that
    does not answer yet is waited for (servers.CLUSTER_WAIT_S, or `wait_s`)."""
    from calib_core.data.staging import dataset_uri, staged_source
    from calib_core.data.torchvision_sets import SPECS

    d = cfg.run.data
    if d.download or d.root is None or d.name not in SPECS:
        return
    root = Path(d.root).expanduser().absolute()
    missing = [rel for rel in SPECS[d.name].files if not (root / rel).is_file()]
    source = staged_source()
    staged = None
    if missing and source:

        def probe() -> str | None:
            return _staged_reason(source, d.name, SPECS[d.name].files, timeout)

        staged = wait_for(probe, f"the staged copy at {dataset_uri(source, d.name)}", cluster=True, wait_s=wait_s)
    problem = staged_data_problem(d.name, str(root), missing, source, staged)
    if problem:
        raise ConfigError(problem)
