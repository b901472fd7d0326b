"""Every published per-seed bootstrap half-width of protocols A and B recomputed from the compact row arrays, in the
stored form and, where they are stored as uint16, recoded to uint8 with M sub-bins per bin (`row_encoding.py`).

    python -m benchmarks.studies.row_encoding_check                        # the arrays as stored (~10 min)
    python -m benchmarks.studies.row_encoding_check --subbins 4 8 17       # uint16 files: also these recodings
    python -m benchmarks.studies.row_encoding_check --sizes-only [FILE...] --subbins 4 8   # sizes, both layouts

A claim row's half-width (`bootstrap_half_width` in `benchmarks/results/method_study_v2.json` (B) and
`method_study_v2a.json` (A)) is the median over its evaluation seeds of the half-width of the 95 % percentile
interval of the paired bootstrap ECE(method) - ECE(reference), the study's own computation
(the retired `method_study.per_seed_bootstrap`: `resample_counts(N, resamples, seed=1000 + seed)`, one ECE per task averaged),
here from the compact arrays directly. Prints one table per study (published value, each form's value and its
difference) and the largest |difference| per form; exit status 1 when one exceeds --tolerance (default 1e-4).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, ROOT, read_json
from benchmarks.studies.row_encoding import SUBBINS, read_rows, recode_arrays, rows_bytes, task_conf

STUDIES = {  # name -> (published report, protocol spec, compact rows)
    "B": ("method_study_v2.json", "method_study_v2.yaml", "method_study_v2_compact/rows.npz"),
    "A": ("method_study_v2a.json", "method_study_v2a.yaml", "method_study_v2a_compact/rows.npz"),
}


def _tasks(arrays: dict[str, np.ndarray], key: str, m: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(conf, correct, keep over all rows, K) per task of one run's compact arrays."""
    out = []
    t = 0
    while f"{key}/t{t}_n" in arrays:
        n_all, n_kept, k = (int(v) for v in arrays[f"{key}/t{t}_n"])
        conf = task_conf(arrays, f"{key}/t{t}_", m)
        correct = np.unpackbits(arrays[f"{key}/t{t}_correct"], count=n_kept).astype(bool)
        keep = np.unpackbits(arrays[f"{key}/t{t}_keep"], count=n_all).astype(bool)
        out.append((conf, correct, keep, k))
        t += 1
    return out


def ece_replicates(arrays: dict[str, np.ndarray], key: str, seed: int, resamples: int, m: int) -> Any:
    """The run's bootstrap ECE replicates (mean over tasks), resampled as `method_study.per_seed_bootstrap` does."""
    import torch

    from calib_core.metrics.bootstrap import bootstrap_metrics, resample_counts

    tasks = _tasks(arrays, key, m)
    counts = resample_counts(len(tasks[0][2]), resamples, seed=1000 + seed)
    reps = []
    for conf, correct, keep, k in tasks:
        probs = np.repeat(((1.0 - conf) / (k - 1))[:, None], k, axis=1)  # as method_study.stored_predictions
        probs[:, 0] = conf
        labels = np.where(correct, 0, 1)
        reps.append(bootstrap_metrics(probs, labels, counts[:, torch.from_numpy(keep)], names=["ece"])["ece"])
    return torch.stack(reps).mean(0)


def half_widths(study: str, forms: dict[str, tuple[dict[str, np.ndarray], int]]) -> list[dict[str, Any]]:
    """Per claim row of the published report: its half-width, recomputed in each form."""
    from benchmarks.studies.protocol_a import load_spec
    from calib_core.metrics.bootstrap import percentile_interval

    report, protocol, _ = STUDIES[study]
    pub = read_json(RESULTS_DIR / report)
    spec = load_spec(ROOT / "benchmarks" / "studies" / "protocols" / protocol)
    resamples, n_eval = spec["evaluation"]["bootstrap_resamples"], len(spec["evaluation"]["seeds"])
    cache: dict[tuple[str, str, int], Any] = {}
    rows = []
    for name, claim_rows in pub["claims"].items():
        claim = spec["claims"][name]
        for row in claim_rows:
            out = {"claim": name, "regime": row["regime"], "published": row["bootstrap_half_width"]}
            for form, (arrays, m) in forms.items():
                hws = []
                for s in row["seeds"][:n_eval]:
                    reps = []
                    for method in (claim["method"], claim["reference"]):
                        key = (form, f"{row['regime']}/eval/{method}/seed{s}", s)
                        if key not in cache:
                            cache[key] = ece_replicates(arrays, key[1], s, resamples, m)
                        reps.append(cache[key])
                    lo, hi = percentile_interval(reps[0] - reps[1], 0.95)
                    hws.append((hi - lo) / 2)
                out[form] = statistics.median(hws)
            rows.append(out)
            print(_line(study, out, list(forms)), flush=True)
    return rows


def _line(study: str, r: dict[str, Any], forms: list[str]) -> str:
    cells = [f"{1e2 * r[f]:.4f} ({1e2 * (r[f] - r['published']):+.4f})" for f in forms]
    return f"| {study} | {r['claim']} | {r['regime']} | {1e2 * r['published']:.4f} | " + " | ".join(cells) + " |"


def load(path: Path) -> dict[str, np.ndarray]:
    return dict(read_rows(path))


def forms_of(arrays: dict[str, np.ndarray], subbins: list[int]) -> dict[str, tuple[dict[str, np.ndarray], int]]:
    """The stored form, plus each recoding when the stored confidences are uint16."""
    stored = {a.dtype.name for k, a in arrays.items() if k.endswith("conf")}
    forms = {f"stored ({'+'.join(sorted(stored))})": (arrays, SUBBINS)}
    if "uint16" in stored:
        for m in subbins:
            recoded = dict(arrays)
            recode_arrays(recoded, m)  # with the per-bin sums, as the files are recoded
            forms[f"uint8 M={m}"] = (recoded, m)
    return forms


def npz_size(arrays: dict[str, np.ndarray], packed: bool) -> int:
    return len(rows_bytes(arrays, packed))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--subbins", type=int, nargs="*", default=[], help="recodings of uint16 files to compare")
    p.add_argument("--studies", nargs="*", default=list(STUDIES), choices=list(STUDIES))
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--sizes-only", nargs="*", type=Path, default=None, metavar="FILE")
    a = p.parse_args(argv)
    if a.sizes_only is not None:
        for f in a.sizes_only or [RESULTS_DIR / STUDIES[s][2] for s in a.studies]:
            arrays = load(f)
            sizes = {
                f"{form}{' packed' if packed else ''}": npz_size(arr, packed)
                for form, (arr, _) in forms_of(arrays, a.subbins).items()
                for packed in (False, True)
            }
            print(f"{f}: " + ", ".join(f"{form} {b / 1e6:.2f} MB" for form, b in sizes.items()), flush=True)
        return 0
    worst: dict[str, float] = {}
    for study in a.studies:
        t0 = time.perf_counter()
        forms = forms_of(load(RESULTS_DIR / STUDIES[study][2]), a.subbins)
        print(f"\n## protocol {study}: half-width, pt (minus published)\n")
        print("| study | claim | regime | published | " + " | ".join(forms) + " |")
        print("|---|---|---|---|" + "---|" * len(forms))
        rows = half_widths(study, forms)
        for form in forms:
            d = max(abs(r[form] - r["published"]) for r in rows)
            worst[f"{study} {form}"] = d
        print(f"\n{len(rows)} claim rows, {time.perf_counter() - t0:.0f} s")
    print("\nlargest |recomputed - published| half-width:")
    for k, d in worst.items():
        print(f"  {k}: {d:.2e}")
    return int(any(d > a.tolerance for d in worst.values()))


if __name__ == "__main__":
    sys.exit(main())
