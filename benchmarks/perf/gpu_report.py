"""What the GPU acceptance run (benchmarks/perf/gpu_acceptance.py) reports: each part's outcome (`Part`), the device
by torch and by nvidia-smi, the package versions, and gpu.md."""

from __future__ import annotations

import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

Row = dict[str, Any]
PACKAGES = ("torch", "torchvision", "torchmetrics", "numpy", "ray", "optuna", "mlflow", "timm")


@dataclass
class Part:
    """One part's outcome: `skipped` says why the device work did not run, `exercised` what ran instead."""

    key: str
    title: str
    rows: list[Row] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)
    skipped: str = ""
    exercised: str = ""
    failed: str = ""
    note: str = ""
    seconds: float = 0.0

    @property
    def status(self) -> str:
        """ran | skipped: <why> | failed: <why>."""
        if self.failed:
            return f"failed: {self.failed}"
        return f"skipped: {self.skipped}" if self.skipped else "ran"

    def line(self) -> str:
        """The part's summary line."""
        bad = [what for what, ok in self.checks if not ok]
        extra = f"; ran instead: {self.exercised}" if self.exercised else ""
        extra += f"; {len(self.checks) - len(bad)}/{len(self.checks)} checks passed" if self.checks else ""
        extra += f" (failed: {'; '.join(bad)})" if bad else ""
        return f"[{self.key}] {self.title}: {self.status}{extra} ({self.seconds:.1f} s)"


def run_part(part: Part, fn: Callable[[Part], None]) -> Part:
    """Fill `part` by `fn`; an exception fails this part only (the others still run), its traceback on stderr."""
    t0 = time.perf_counter()
    try:
        fn(part)
    except Exception as exc:  # noqa: BLE001 - a failed part is a result; the run goes on
        traceback.print_exc()
        part.failed = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    part.seconds = time.perf_counter() - t0
    print(part.line(), flush=True)
    return part


def nvidia_smi(*query: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi <query> --format=csv,noheader,nounits`, or None without nvidia-smi (or on its error)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def device_description() -> dict[str, Any]:
    """The device as nvidia-smi names it (name, driver, memory), or why it could not."""
    rows = nvidia_smi("--query-gpu=name,driver_version,memory.total")
    if rows is None:
        return {"nvidia_smi": "not available (no nvidia-smi, or it failed)"}
    return {"nvidia_smi": [{"name": r[0], "driver": r[1], "memory_total_mib": r[2]} for r in rows if len(r) >= 3]}


def packages() -> dict[str, str | None]:
    """Installed versions of the packages the figures depend on (None where not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe_device(cuda: bool) -> dict[str, Any]:
    """The device by torch.cuda.get_device_name and by nvidia-smi."""
    import torch

    torch_name = (
        f"{torch.cuda.get_device_name(0)} (torch.cuda.get_device_name(0))"
        if cuda
        else "no CUDA device (torch.cuda.is_available() is False)"
    )
    return {"torch": torch_name, "cuda_runtime": torch.version.cuda, **device_description()}


def _cleanness(clean: bool | None) -> str:
    """The commit's qualifier: the tree matched it, differed, or was named by its sender (CALIB_SOURCE_COMMIT)."""
    if clean is None:
        return "named by the sender of the tree, which is not checked"
    return "clean" if clean else "working tree differs"


def markdown(report: dict[str, Any], parts: list[Part]) -> str:
    """gpu.md: the device, the provenance, then each part's status, figures beside their commands, and checks."""
    dev, prov = report["device"], report["provenance"]
    smi = dev["nvidia_smi"]
    smi_text = (
        smi
        if isinstance(smi, str)
        else "; ".join(f"{g['name']}, driver {g['driver']}, {g['memory_total_mib']} MiB" for g in smi)
    )
    lines = [
        "# GPU acceptance (benchmarks/perf/gpu_acceptance.py)",
        "",
        *(["**DRY RUN on CPU: no figure below is a device figure.**", ""] if report["dry_run"] else []),
        f"Command: `{report['command']}`; {report['date']} UTC; {report['total_s']:.0f} s in all.",
        "",
        f"Device: {dev['torch']}; nvidia-smi: {smi_text}; CUDA runtime {dev['cuda_runtime']}.",
        "",
        f"Commit {str(prov['git_commit'])[:10]} ({_cleanness(prov['git_clean'])}); "
        f"CPU {prov['cpu_model']}, {report['cpu_count']} CPUs, torch threads {prov['threads']}; "
        + ", ".join(f"{k} {v}" for k, v in report["packages"].items() if v),
        "",
    ]
    for p in parts:
        lines += [
            f"## ({p.key}) {p.title}",
            "",
            f"Status: {p.status}." + (f" Ran instead: {p.exercised}." if p.exercised else ""),
        ]
        if p.note:
            lines += ["", p.note]
        if p.rows:
            lines += ["", "| measurement | figure | command |", "|---|---|---|"]
            lines += [f"| {r['what']} | {r['figure']} | `{r['command']}` |" for r in p.rows]
        if p.checks:
            lines += [""] + [f"- [{'x' if ok else ' '}] {what}" for what, ok in p.checks]
        lines.append("")
    return "\n".join(lines)
