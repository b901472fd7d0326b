"""The method study's compact storage of test predictions (top-label confidence and correctness) gives
the same per-seed paired ECE bootstrap as the full probabilities, for single- and multi-task runs."""

from __future__ import annotations

import numpy as np

from benchmarks.studies.method_study import per_seed_bootstrap, top_label_arrays
from benchmarks.studies.method_study_v2 import eval_path


def _probs(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return rng.dirichlet(np.full(k, 0.3), n).astype(np.float32)


def _write(root, compact: bool, method: str, seed: int, probs: list[np.ndarray], labels: np.ndarray) -> None:
    path = eval_path(root, "r", method, seed).with_suffix(".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    if labels.ndim == 1:
        arrays = (
            {"labels": labels, **top_label_arrays(probs[0], labels)}
            if compact
            else {"probs": probs[0], "labels": labels}
        )
    else:
        arrays = {"task_labels": labels}
        for t, p in enumerate(probs):
            arrays.update(top_label_arrays(p, labels[:, t], f"task{t}_") if compact else {f"task{t}_probs": p})
    np.savez_compressed(path, **arrays)


def test_compact_and_full_storage_give_the_same_per_seed_intervals(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    for kind, ks in (("single", [10]), ("multi", [10, 2, 3])):
        full, compact = tmp_path / kind / "full", tmp_path / kind / "compact"
        for seed in (1, 2):
            if kind == "single":
                labels = rng.integers(0, 10, n)
            else:
                labels = np.stack([rng.integers(0, k, n) for k in ks], 1)
                labels[rng.random(labels.shape) < 0.2] = -1
            for method in ("a", "b"):
                probs = [_probs(rng, n, k) for k in ks]
                _write(full, False, method, seed, probs, labels)
                _write(compact, True, method, seed, probs, labels)
        want = per_seed_bootstrap(full, "r", "a", "b", [1, 2], 200, path_fn=eval_path)
        got = per_seed_bootstrap(compact, "r", "a", "b", [1, 2], 200, path_fn=eval_path)
        assert len(want) == 2 and got == want, (kind, got, want)
