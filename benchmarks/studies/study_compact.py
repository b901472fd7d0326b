"""Compact form of a method study's raw folder (issue #31 item 5): one per-run table + compact row arrays.

    python -m benchmarks.studies.study_compact benchmarks/results/method_study_v2a OUT_DIR   # convert

A raw folder (`benchmarks/results/method_study_<name>/<regime>/<stage>/<method>/<file>`) holds one JSON per
run, the tuning's `chosen.json` per method, `trialNN.json` (a trial's parameters, stored before it ran: a
resumption aid, not converted) and, per evaluation run, an .npz of its test predictions. The compact form:

- `runs.csv.gz`: one row per run JSON: `path` (relative to the raw folder), the record's scalar fields, and
  its dicts flattened (`param_<k>`, `val_<k>`, `test_<k>`); floats are written with `repr`, so every value
  reads back bit for bit (`records()` rebuilds each run's record exactly);
- `chosen.json.gz`: every `chosen.json`, keyed by its path, with the run-file lists made relative;
- `rows.npz`: per evaluation run (key = its path without suffix) and task: top-label confidence, correctness
  bit-packed, the labelled-row mask bit-packed, n and K, in the packed layout of
  `benchmarks/studies/row_encoding.py` (`read_rows` gives the arrays by key). The confidence is stored bin-exact
  in one byte (15-bin index and sub-bin, with each bin's exact confidence sum) since the recode that moved A's
  file from 17.95 to 5.69 MB and B's from 3.36 to 0.68 MB; see that module for what it changes in the published
  per-seed bootstrap half-widths. uint16 confidences (conf x 65535, rounded; the first form) still read.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.studies.row_encoding import encode_task, quantize_conf, read_rows, task_conf, write_rows

_PREFIXES = {"params": "param_", "val": "val_", "test": "test_"}
_INTS = ("seed", "epochs_run", "best_epoch", "threads")


def _flatten(rec: dict[str, Any]) -> dict[str, str]:
    row: dict[str, str] = {}
    for k, v in rec.items():
        if k in _PREFIXES and isinstance(v, dict):
            row[f"has_{k}"] = "1"
            for kk, vv in v.items():
                row[_PREFIXES[k] + kk] = _cell(vv)
        else:
            row[k] = _cell(v)
    return row


def _cell(v: Any) -> str:
    if v is None:
        return "\\N"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return "json:" + json.dumps(v, separators=(",", ":"))
    return str(v)


def _parse(k: str, v: str) -> Any:
    if v == "\\N":
        return None
    if v in ("true", "false"):
        return v == "true"
    if v.startswith("json:"):
        return json.loads(v[5:])
    if k in _INTS:
        return int(v)
    try:
        f = float(v)
    except ValueError:
        return v
    if k.startswith(tuple(_PREFIXES.values())) or k in ("wall_s",):
        return f
    return v


def records(table: Path) -> dict[str, dict[str, Any]]:
    """{path: record} rebuilt from `runs.csv.gz` (the raw JSON's dict, key order aside)."""
    with gzip.open(table, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for row in rows:
        rec: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for k, v in row.items():
            if v == "" or k == "path":
                continue
            if k.startswith("has_"):
                nested.setdefault(k[4:], {})
                continue
            for name, pre in _PREFIXES.items():
                if k.startswith(pre):
                    nested.setdefault(name, {})[k[len(pre) :]] = _parse(k, v)
                    break
            else:
                rec[k] = _parse(k, v)
        rec.update(nested)
        out[row["path"]] = rec
    return out


def compact_arrays(z: Any) -> dict[str, np.ndarray]:
    """One evaluation .npz (full probabilities, or top-label confidence and correctness) in compact form."""
    out: dict[str, np.ndarray] = {}
    tasks: list[tuple[str, np.ndarray, np.ndarray]] = []  # (prefix, probs or None, labels)
    if "labels" in z.files:
        tasks.append(("", z, np.asarray(z["labels"])))
    else:
        labels = np.asarray(z["task_labels"])
        for t in range(labels.shape[1]):
            tasks.append((f"task{t}_", z, labels[:, t]))
    for t, (prefix, zz, labels) in enumerate(tasks):
        keep = labels >= 0
        if f"{prefix}probs" in zz.files:
            p = np.asarray(zz[f"{prefix}probs"], dtype=np.float64)
            conf, correct, k = p.max(1), p.argmax(1) == labels, p.shape[1]
        else:
            conf = np.asarray(zz[f"{prefix}conf"], dtype=np.float64)
            correct, k = np.asarray(zz[f"{prefix}correct"]).astype(bool), int(zz[f"{prefix}num_classes"])
        out.update({f"t{t}_{name}": a for name, a in encode_task(quantize_conf(conf[keep]), k).items()})
        out[f"t{t}_correct"] = np.packbits(correct[keep])
        out[f"t{t}_keep"] = np.packbits(keep)
        out[f"t{t}_n"] = np.array([len(labels), int(keep.sum()), k], dtype=np.int64)
    out["multitask"] = np.array(int("labels" not in z.files))
    return out


def convert(raw: Path, out: Path) -> dict[str, int]:
    """Write the compact form of `raw` into `out`; return counts."""
    raw, out = Path(raw), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, chosen, arrays = [], {}, {}
    for p in sorted(raw.rglob("*.json")):
        rel = p.relative_to(raw).as_posix()
        rec = json.loads(p.read_text())
        if p.name == "chosen.json":
            for t in rec.get("trials", []):
                t["runs"] = [os.path.relpath(r, raw) if os.path.isabs(r) else r for r in t.get("runs", [])]
            chosen[rel] = rec
            continue
        if p.name.startswith("trial") and "_seed" not in p.name:
            continue  # a trial's parameters stored before it ran (resumption aid)
        rows.append({"path": rel, **_flatten(rec)})
        npz = p.with_suffix(".npz")
        if npz.is_file():
            with np.load(npz) as z:
                for k, v in compact_arrays(z).items():
                    arrays[f"{rel[:-5]}/{k}"] = v
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    (out / "runs.csv.gz").write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    (out / "chosen.json.gz").write_bytes(gzip.compress(json.dumps(chosen, sort_keys=True).encode(), mtime=0))
    write_rows(out / "rows.npz", arrays, packed=True)
    return {"runs": len(rows), "chosen": len(chosen), "arrays": len(arrays)}


class CompactNpz:
    """An evaluation run's compact arrays seen as the raw .npz the retired `method_study.stored_predictions` read
    (top-label confidence, correctness, K per task; labels -1 where missing)."""

    def __init__(self, z: Any, key: str) -> None:
        self._d: dict[str, np.ndarray] = {}
        multitask = bool(int(z[f"{key}/multitask"]))
        t = 0
        labels = []
        while f"{key}/t{t}_n" in z.files:
            n_all, n_kept, k = (int(v) for v in z[f"{key}/t{t}_n"])
            keep = np.unpackbits(z[f"{key}/t{t}_keep"], count=n_all).astype(bool)
            conf = np.zeros(n_all, dtype=np.float64)
            correct = np.zeros(n_all, dtype=bool)
            conf[keep] = task_conf(z, f"{key}/t{t}_")
            correct[keep] = np.unpackbits(z[f"{key}/t{t}_correct"], count=n_kept).astype(bool)
            prefix = f"task{t}_" if multitask else ""
            self._d[f"{prefix}conf"], self._d[f"{prefix}correct"] = conf, correct
            self._d[f"{prefix}num_classes"] = np.array(k)
            labels.append(np.where(keep, 0, -1))
            t += 1
        if multitask:
            self._d["task_labels"] = np.stack(labels, axis=1)
        else:
            self._d["labels"] = np.where(self._d["correct"], 0, 1)
        self.files = list(self._d)

    def __getitem__(self, k: str) -> np.ndarray:
        return self._d[k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw")
    p.add_argument("out")
    a = p.parse_args(argv)
    print(convert(Path(a.raw), Path(a.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def materialize(compact: Path, raw: Path) -> int:
    """Rebuild a raw folder from the compact form (run JSONs, chosen.json, evaluation .npz with top-label
    confidence and correctness), so the study's own report code runs on it unchanged; return the runs written."""
    compact, raw = Path(compact), Path(raw)
    recs = records(compact / "runs.csv.gz")
    for rel, rec in recs.items():
        p = raw / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(rec, indent=1))
    for rel, rec in json.loads(gzip.decompress((compact / "chosen.json.gz").read_bytes())).items():
        p = raw / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for t in rec.get("trials", []):
            t["runs"] = [str(raw / r) for r in t.get("runs", [])]
        p.write_text(json.dumps(rec, indent=1))
    z = read_rows(compact / "rows.npz")
    for key in sorted({f.rsplit("/", 1)[0] for f in z.files}):
        c = CompactNpz(z, key)
        np.savez(raw / f"{key}.npz", **{k: c[k] for k in c.files})
    return len(recs)


def compact_dir(raw: Path) -> Path:
    """Where a study's compact form lives: beside its raw folder, `<raw>_compact/`."""
    raw = Path(raw)
    return raw.with_name(raw.name + "_compact")


_MATERIALIZED: dict[str, Path] = {}


def raw_or_compact(raw: Path) -> Path:
    """The study's raw folder if it is in the tree; otherwise its compact form rebuilt once per process into a
    temporary folder (read-only use: reports and comparisons, not new runs)."""
    raw = Path(raw)
    if raw.is_dir() or not compact_dir(raw).is_dir():
        return raw
    key = str(raw.resolve())
    if key not in _MATERIALIZED:
        import atexit
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix=f"{raw.name}_"))
        atexit.register(shutil.rmtree, tmp, True)
        materialize(compact_dir(raw), tmp)
        _MATERIALIZED[key] = tmp
    return _MATERIALIZED[key]
