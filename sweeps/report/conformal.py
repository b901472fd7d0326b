"""The report's conformal section: the champion's test coverage against alpha and its set-size distribution (one
figure), and per candidate its test coverage and mean set size with intervals, its validation (cross-fitted) mean
set size and its worst class and worst size stratum, at each configured alpha and method."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sweeps.contract import PREDICTIONS_FILE, TS_PREFIX, conformal_key

# the alphas of the coverage curve (the configured ones are added)
CURVE_ALPHAS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)


def _champion_arrays(champion: Any) -> dict[str, np.ndarray] | None:
    """The champion's val/test probabilities and labels (its "+ TS" ones for a + TS candidate), or None."""
    if champion.checkpoint is None:
        return None
    prefix = TS_PREFIX if champion.post else ""
    with champion.checkpoint.as_directory() as d, np.load(Path(d) / PREDICTIONS_FILE) as z:
        keys = [f"{prefix}{s}_{w}" for s in ("val", "test") for w in ("probs", "labels")]
        if not all(k in z.files for k in keys):
            return None
        return {k.removeprefix(prefix): z[k] for k in keys}


def conformal_plot(champion: Any, alphas: list[float], methods: Sequence[str], path: Path) -> Path | None:
    """Left: the champion's test coverage against alpha per method (sets from all validation rows), beside 1 - alpha.
    Right: its test set sizes at the first configured alpha. None when its predictions are not at hand."""
    import torch

    from calib_core import conformal as cp
    from sweeps.report.files import pyplot

    arrays = _champion_arrays(champion)
    if arrays is None or not alphas:
        return None
    grid = sorted(set(CURVE_ALPHAS) | set(alphas))
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(grid, [1 - a for a in grid], "k--", lw=1, label="1 - alpha")
    sizes = {}
    for method in methods:
        random = cp.get_method(method).randomized
        uv = cp.uniform_draws(len(arrays["val_labels"]), 1) if random else None
        ut = cp.uniform_draws(len(arrays["test_labels"]), 2) if random else None
        s_val = cp.calibration_scores(method, arrays["val_probs"], arrays["val_labels"], u=uv)
        s_test = cp.label_scores(method, arrays["test_probs"], u=ut)
        true = s_test.gather(1, torch.as_tensor(arrays["test_labels"]).long().unsqueeze(1)).squeeze(1)
        qs = [cp.conformal_quantile(s_val, a) for a in grid]
        left.plot(grid, [float((true <= q).double().mean()) for q in qs], marker="o", ms=3, label=method)
        sizes[method] = (s_test <= qs[grid.index(alphas[0])]).sum(1).numpy()
    left.set_xlabel("alpha (miscoverage)")
    left.set_ylabel("test coverage")
    left.set_title("Champion: coverage against alpha")
    left.legend(fontsize=8)
    top = int(max(int(s.max()) for s in sizes.values()))
    bins = np.arange(-0.5, top + 1.5)
    right.hist(list(sizes.values()), bins=bins, label=list(sizes), histtype="bar")
    right.set_xlabel(f"set size (alpha = {alphas[0]:g})")
    right.set_ylabel("test rows")
    right.set_title("Champion: set sizes")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cell(row: Any, key: str, pct: bool) -> str:
    v = row.get(key)
    if v is None or v != v:
        return "-"
    f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.2f}")
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    return f"{f(v)} [{f(lo)}, {f(hi)}]" if lo is not None and lo == lo else f(v)


def conformal_table(board: Any, alphas: list[float], methods: Sequence[str]) -> str:
    """One HTML table per alpha: a row per candidate, per method its test coverage %, mean test set size (with
    intervals), mean validation set size (cross-fitted), worst class and worst size stratum coverage % (test)."""
    out = []
    for alpha in alphas:
        present = [m for m in methods if f"test_{conformal_key(m, alpha, 'size')}" in board]
        if not present:
            continue
        head = "<th>candidate</th>" + "".join(
            f"<th>{m}: test cov %</th><th>{m}: test size</th><th>{m}: val size</th>"
            f"<th>{m}: worst class / size-stratum cov %</th>"
            for m in present
        )
        rows = []
        for _, row in board.iterrows():
            cells = [f"<td>{html.escape(str(row.get('label')))}</td>"]
            for m in present:
                key = {w: conformal_key(m, alpha, w) for w in ("coverage", "size", "worst_class_coverage")}
                key["worst_size"] = conformal_key(m, alpha, "worst_size_coverage")
                worst = " / ".join(_cell(row, f"test_{key[w]}", True) for w in ("worst_class_coverage", "worst_size"))
                cells += [
                    f"<td>{_cell(row, 'test_' + key['coverage'], True)}</td>",
                    f"<td>{_cell(row, 'test_' + key['size'], False)}</td>",
                    f"<td>{_cell(row, 'val_' + key['size'], False)}</td>",
                    f"<td>{worst}</td>",
                ]
            cls = ' class="champion"' if bool(row.get("champion")) else ""
            rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
        out.append(f'<h3>alpha = {alpha:g}</h3><table class="conformal"><tr>{head}</tr>{"".join(rows)}</table>')
    return "".join(out)


def _strata(edges: Sequence[int]) -> str:
    """The set-size strata (lower edges) in words: 0-1, 2-3, 4-10, ..., 1001+."""
    parts = [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])]
    return ", ".join([*parts, f"{edges[-1]}+"])


def conformal_section(champion: Any, board: Any, alphas: list[float], methods: Sequence[str], folder: Path) -> str:
    """The report's conformal section (figure and tables), "" when no candidate has sets; its PNG in `folder`."""
    from calib_core.conformal.measures import MIN_ROWS, SIZE_STRATA
    from sweeps.report.html import _png

    table = conformal_table(board, alphas, methods) if alphas else ""
    if not table:
        return ""
    png = conformal_plot(champion, alphas, methods, folder / "conformal.png")
    intro = (
        "<p>Split conformal sets of every candidate (the finite-sample quantile, the ceil((n + 1)(1 - alpha))-th "
        "smallest validation score): test sets from the quantile of all validation rows, validation sizes cross-fitted "
        "on validation folds. Intervals: paired bootstrap over test rows. Worst class / size-stratum cov: the lowest "
        f"test coverage over the true classes, and over the set-size strata {_strata(SIZE_STRATA)} (Angelopoulos et "
        f"al. 2021), among those with at least {MIN_ROWS} test rows.</p>"
    )
    figure = f'<img class="conformal" alt="conformal sets" src="{_png(png)}">' if png else ""
    return intro + figure + table
