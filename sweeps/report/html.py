"""The sweep report: one self-contained HTML file (no script, no network: images inline, the parallel coordinates
drawn as SVG) that a person can open offline or attach to a ticket.

Sections: what ran; the selection in plain sentences (and the champion gate's line); the leaderboard with
intervals; the Pareto plot; parallel coordinates (calibrator, log10 calibrator lr, any other searched value,
validation accuracy, validation ECE; the champion drawn on top in red); parameter importance from the study;
the champion's and the most accurate trial's reliability diagrams (test split) side by side; links to the
MLflow runs and the Optuna dashboard command.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps.contract import status_words
from sweeps.decide.selection import TrialRecord

REPORT_FILE = "report.html"


@dataclass
class ReportLinks:
    """Where the report points: the MLflow UI root ('' when it must be started), the experiment id, the
    dashboard command, and the Ray Tune folder."""

    mlflow_root: str
    experiment_id: str
    dashboard: str = ""
    mlflow_hint: str = ""
    tune_folder: str = ""
    runs: dict[str, str] = field(default_factory=dict)  # trial id -> MLflow run id


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _png(path: str | Path | None) -> str:
    if path is None or not Path(path).is_file():
        return ""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _pct(v: Any) -> str:
    return "-" if v is None or v != v else f"{100 * float(v):.1f}"


def _axis_values(records: list[TrialRecord], key: str) -> list[Any]:
    if key in ("val_accuracy", "val_ece"):
        return [r.metrics.get(key) for r in records]
    return [r.params.get(key) for r in records]


def parallel_coordinates(records: list[TrialRecord], champion: TrialRecord | None, params: Sequence[str]) -> str:
    """An SVG with one axis per searched value and val accuracy / val ECE, one line per completed trial as trained
    (the search's view: a "+ TS" candidate shares its trial's searched values; its trial's line is the champion's)."""
    ok = [r for r in records if r.ok and not r.post]
    axes: list[tuple[str, str, Any]] = []  # (key, title, mapper to [0, 1] or None)
    for key in ("calibrator", "calibrator_lr", *[p for p in params if p not in ("calibrator", "calibrator_lr")]):
        vals = [v for v in _axis_values(ok, key) if v is not None]
        if not vals:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            log = key.endswith("lr") or (min(vals) > 0 and max(vals) / max(min(vals), 1e-300) >= 100)
            tf = (lambda v: math.log10(v)) if log and min(vals) > 0 else (lambda v: float(v))
            lo, hi = min(tf(v) for v in vals), max(tf(v) for v in vals)
            title = f"log10 {key}" if log and min(vals) > 0 else key
            axes.append((key, title, ("num", tf, lo, hi)))
        else:
            cats = sorted({str(v) for v in vals})
            axes.append((key, key, ("cat", cats)))
    for key, title in (("val_accuracy", "val accuracy"), ("val_ece", "val ECE")):
        vals = [r.metrics[key] for r in ok]
        axes.append((key, title, ("num", float, min(vals) if vals else 0.0, max(vals) if vals else 1.0)))
    width, height, top, bottom, left = 180 * len(axes) + 60, 380, 40, 50, 60
    span = height - top - bottom

    def y_of(axis: Any, v: Any) -> float | None:
        if v is None or (isinstance(v, float) and v != v):
            return None
        if axis[0] == "cat":
            cats = axis[1]
            frac = 0.5 if len(cats) == 1 else cats.index(str(v)) / (len(cats) - 1)
        else:
            _, tf, lo, hi = axis
            frac = 0.5 if hi == lo else (tf(v) - lo) / (hi - lo)
        return top + span * (1.0 - frac)

    xs = [left + 180 * i for i in range(len(axes))]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="parcoords" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="parallel coordinates of the trials">'
    ]
    lines = []
    for r in sorted(ok, key=lambda r: champion is not None and r.trial_id == champion.trial):
        pts = [(x, y_of(ax[2], v)) for x, ax, v in zip(xs, axes, [_axis_values([r], a[0])[0] for a in axes])]
        if any(y is None for _, y in pts):
            continue
        is_champ = champion is not None and r.trial_id == champion.trial
        style = 'stroke="#d62728" stroke-width="3"' if is_champ else 'stroke="#1f77b4" stroke-width="1.2" opacity="0.6"'
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        cls = "trial champion" if is_champ else "trial"
        lines.append(
            f'<polyline class="{cls}" data-trial="{_e(r.trial_id)}" fill="none" {style} points="{coords}">'
            f"<title>{_e(r.label)}</title></polyline>"
        )
    for x, (_key, title, axis) in zip(xs, axes):
        parts.append(f'<line class="axis" x1="{x}" y1="{top}" x2="{x}" y2="{top + span}" stroke="#333"/>')
        parts.append(f'<text class="axis-title" x="{x}" y="{top - 14}" text-anchor="middle">{_e(title)}</text>')
        if axis[0] == "cat":
            for c in axis[1]:
                y = y_of(axis, c)
                parts.append(f'<text x="{x + 5}" y="{y:.1f}" font-size="11" dominant-baseline="middle">{_e(c)}</text>')
        else:
            _, tf, lo, hi = axis
            for frac in (0.0, 0.5, 1.0):
                val = lo + frac * (hi - lo)
                label = f"{val:.2f}" if abs(val) < 1000 else f"{val:.3g}"
                y = top + span * (1.0 - frac)
                parts.append(f'<text x="{x + 5}" y="{y:.1f}" font-size="11" dominant-baseline="middle">{label}</text>')
    parts += lines
    parts.append("</svg>")
    return "".join(parts)


def _importance_html(importances: dict[str, dict[str, float]] | None, note: str) -> str:
    if not importances:
        return f"<p>{_e(note or 'No parameter importance (too few completed trials).')}</p>"
    out = []
    for objective, imp in importances.items():
        rows = "".join(
            f'<tr class="importance"><td>{_e(k)}</td><td><div class="bar" style="width:{300 * v:.0f}px"></div></td>'
            f"<td>{v:.2f}</td></tr>"
            for k, v in sorted(imp.items(), key=lambda kv: -kv[1])
        )
        out.append(f"<h3>{_e(objective)}</h3><table>{rows}</table>")
    return "".join(out) + (f"<p>{_e(note)}</p>" if note else "")


def _board_html(board: Any, links: ReportLinks) -> str:
    cols = [
        ("label", "trial"),
        ("status", "status"),
        ("val_accuracy", "val acc %"),
        ("val_ece", "val ECE %"),
        ("test_accuracy", "test acc %"),
        ("test_ece", "test ECE %"),
    ]
    head = "".join(f"<th>{_e(t)}</th>" for _, t in cols) + "<th>MLflow run</th>"
    rows = []
    for _, row in board.iterrows():
        cells = []
        for key, _title in cols:
            v = row.get(key)
            if key in ("label", "status"):
                cells.append(f"<td>{_e(status_words(str(v)) if key == 'status' else v)}</td>")  # "out of memory"
                continue
            lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
            ci = f" [{_pct(lo)}, {_pct(hi)}]" if lo is not None and lo == lo and v == v else ""
            cells.append(f"<td>{_pct(v)}{ci}</td>")
        rid = row.get("run_id")
        url = (
            f"{links.mlflow_root}#/experiments/{links.experiment_id}/runs/{rid}"
            if rid and rid == rid and links.mlflow_root
            else ""
        )
        cells.append(f'<td><a class="run" href="{_e(url)}">{_e(str(rid)[:8])}</a></td>' if url else "<td>-</td>")
        cls = ' class="champion"' if bool(row.get("champion")) else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f'<table class="leaderboard"><tr>{head}</tr>{"".join(rows)}</table>'


def render_report(
    *,
    title: str,
    summary: str,
    records: list[TrialRecord],
    champion: TrialRecord,
    most_accurate: TrialRecord,
    why: str,
    gate: str,
    level: float,
    board: Any,
    pareto_png: str | Path,
    diagrams: dict[str, str | Path | None],
    importances: dict[str, dict[str, float]] | None,
    importance_note: str,
    params: Sequence[str],
    links: ReportLinks,
    conformal_html: str = "",
) -> str:
    """The whole report as one HTML string (`conformal_html`: the conformal section's body, sweeps.report.conformal)."""
    exp_page = (
        f"{links.mlflow_root}#/experiments/{links.experiment_id}?workflowType=machine_learning"
        if links.mlflow_root
        else ""
    )
    why_html = "".join(f"<p>{_e(line)}</p>" for line in why.splitlines())
    gate_html = f'<p class="gate">{_e(gate)}</p>' if gate else ""
    same = champion.trial_id == most_accurate.trial_id
    diag_html = "".join(
        f'<figure><img class="reliability" alt="{_e(cap)}" src="{_png(path)}"><figcaption>{_e(cap)}</figcaption>'
        "</figure>"
        for cap, path in diagrams.items()
        if path is not None
    )
    link_items = []
    if exp_page:
        link_items.append(f'<li><a class="mlflow" href="{_e(exp_page)}">MLflow: the sweep\'s runs</a></li>')
    if links.mlflow_hint:
        link_items.append(f"<li>{_e(links.mlflow_hint)}</li>")
    if links.dashboard:
        link_items.append(f"<li>Optuna dashboard: <code>{_e(links.dashboard)}</code></li>")
    if links.tune_folder:
        link_items.append(f"<li>Ray Tune results: <code>{_e(links.tune_folder)}</code></li>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }}
table {{ border-collapse: collapse; margin: 8px 0; }} td, th {{ border: 1px solid #ccc; padding: 3px 8px; }}
tr.champion td {{ background: #fde2e2; font-weight: bold; }} .bar {{ background: #1f77b4; height: 12px; }}
figure {{ display: inline-block; margin: 0 16px 0 0; }} img.reliability {{ width: 480px; }}
.gate {{ background: #fff4d6; padding: 6px; }} code {{ background: #f2f2f2; padding: 1px 4px; }}
</style></head><body>
<h1>{_e(title)}</h1>
<p class="summary">{_e(summary)}</p>
<h2 id="selection">Selection</h2>
{why_html}{gate_html}
<p>Intervals are {100 * level:.0f} % paired bootstrap intervals over the validation or test rows (the same
resamples for every trial, so differences between trials are paired).</p>
<h2 id="leaderboard">Leaderboard</h2>
{_board_html(board, links)}
<h2 id="pareto">Validation accuracy against validation ECE</h2>
<img class="pareto" alt="Pareto plot" src="{_png(pareto_png)}">
<h2 id="parallel">Parallel coordinates</h2>
<p>One line per completed trial; the champion in red. The learning-rate axis is logarithmic.</p>
{parallel_coordinates(records, champion, params)}
<h2 id="importance">Parameter importance (Optuna)</h2>
{_importance_html(importances, importance_note)}
{conformal_html and f'<h2 id="conformal">Conformal prediction sets</h2>{conformal_html}'}
<h2 id="reliability">Reliability diagrams (test split)</h2>
<p>{"The champion is also the most accurate trial." if same else "The champion and the most accurate trial."}</p>
{diag_html}
<h2 id="links">Links</h2>
<ul>{"".join(link_items)}</ul>
</body></html>
"""
