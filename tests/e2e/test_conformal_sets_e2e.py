"""Conformal sets end to end (issue #48, "must show"): `launch.py` on the MNIST-1D demo (3 trials, 2 epochs, 1,200
samples) with `evaluation.conformal_alphas=[0.05,0.1]` and `selection.rule=smallest_sets`, then what it left:

- report.html shows each candidate's test coverage and mean set size (one row per candidate at each alpha);
- the smallest_sets rule chose the champion (selection.json, the printed sentence), and the champion is the
  smallest validation mean LAC set size at alpha 0.1 among the leaderboard's eligible candidates, recomputed here;
- the champion served over HTTP by the user guide's `mlflow models serve` command, sent the raw MNIST-1D test rows
  (regenerated and split as the loader splits them) with params {"alpha": 0.1}, answers sets of class names whose
  coverage and mean size on those rows are the report's test coverage and size of that candidate.

2.0-2.8 minutes on the 2-core machine under a load of 2.5-6 (40 s of CPU in the test's own process tree).
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.sweep_helpers import FAST, ROOT, free_port, launch, store, sweep_runs, wait_http

pytestmark = pytest.mark.slow

NAME = "sets"
MODEL = "calibrated-mnist1d"  # the default name follows the data (the guide's serve command names it)
ALPHA = 0.1
# rows whose label score lies this close to the quantile may fall either side: the served model's probabilities are
# float64 from float32 logits, the sweep's float32 softmax (docs/conformal.md, Conventions)
BORDER = 1e-6


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("conformal")
    args = ["--num-samples", "3", "--name", NAME, "--seed", "0", *FAST]
    args += ["--set", "selection.rule=smallest_sets", "--set", "evaluation.conformal_alphas=[0.05,0.1]"]
    proc = launch(d, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = store(d)
    (parent,), children = sweep_runs(client, NAME)
    board = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/leaderboard.csv", str(d)))
    selection = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "sweep/selection.json", str(d))).read_text()
    )
    return {"dir": d, "out": proc.stdout, "parent": parent, "children": children, "board": board, "sel": selection}


def _conformal_rows(report: str, alpha: float) -> list[tuple[bool, list[str]]]:
    """(champion?, cell texts) of each row of the report's conformal table at `alpha`."""
    m = re.search(rf'<h3>alpha = {alpha:g}</h3><table class="conformal">(.*?)</table>', report, flags=re.S)
    assert m, f"no conformal table at alpha {alpha:g}"
    rows = re.findall(r"<tr( class=\"champion\")?>(.*?)</tr>", m.group(1), flags=re.S)
    return [(bool(cls), [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", body)]) for cls, body in rows[1:]]


def test_report_shows_coverage_and_set_size_per_candidate(sweep):
    m = re.search(r"^Report: (\S+report\.html)$", sweep["out"], flags=re.M)
    assert m, sweep["out"][-2000:]
    report = Path(m.group(1)).read_text()
    assert "Conformal prediction sets" in report and 'class="conformal"' in report
    board = sweep["board"]
    assert len(board) == 2 * len(sweep["children"])  # each trial as trained and + TS
    for alpha in (0.05, ALPHA):
        rows = _conformal_rows(report, alpha)
        assert sorted(cells[0] for _, cells in rows) == sorted(board["label"])
        head = re.search(rf"<h3>alpha = {alpha:g}</h3><table class=\"conformal\"><tr>(.*?)</tr>", report).group(1)
        assert head.startswith("<th>candidate</th><th>lac: test cov %</th><th>lac: test size</th>"), head
        by_label = board.set_index("label")
        key = f"cp_lac_a{round(100 * alpha)}"
        for champion, cells in rows:
            row = by_label.loc[cells[0]]
            # LAC's test coverage (%) and mean size with their intervals, as the leaderboard holds them
            assert cells[1].startswith(f"{100 * row[f'test_{key}_coverage']:.1f} ["), cells
            assert cells[2].startswith(f"{row[f'test_{key}_size']:.2f} ["), cells
            assert champion == bool(row["champion"])
    assert sum(champion for champion, _ in _conformal_rows(report, ALPHA)) == 1


def test_the_smallest_sets_rule_picked_the_champion_and_said_why(sweep):
    sel, board, out = sweep["sel"], sweep["board"], sweep["out"]
    assert sel["rule"] == "smallest_sets"
    assert sel["rule_settings"]["sets_method"] == "lac" and sel["rule_settings"]["sets_alpha"] == ALPHA
    # recomputed from the leaderboard: the smallest validation mean LAC set size among the eligible candidates
    eligible = board[board["eligible"].astype(bool)]
    size = "val_cp_lac_a10_size"
    smallest = eligible.sort_values([size, "val_nll", "trial_id"]).iloc[0]
    champion = board[board["champion"].astype(bool)].iloc[0]
    assert champion["trial_id"] == smallest["trial_id"] and champion["label"] == sel["label"]
    assert sweep["parent"].data.tags["calib.champion_candidate"] == champion["trial_id"]
    # the sentence, printed: the champion with its set size, then the rule with its counts
    sentence = out[out.index("Selection: ") : out.index("Registered: ")]
    head = f"Selection: {sel['label']} ({sel['family']}): val mean lac set size {smallest[size]:.2f}"
    assert sentence.startswith(head), sentence
    assert (
        f"Rule: smallest val mean lac set size at alpha 0.1 among the {len(eligible)} of {len(board)} candidates shown "
        "to be within 2 pt of the most accurate candidate's val accuracy"
    ) in sentence
    assert sentence.strip() == "Selection: " + sel["why"]
    assert f"Registered: models:/{MODEL}@champion" in out


def _post(url: str, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@contextlib.contextmanager
def _served(sweep_dir: Path):
    """The user guide's serve command (docs/guide.md), as written, on a free port, from the sweep's folder."""
    port = free_port()
    line = next(
        ln
        for ln in (ROOT / "docs" / "guide.md").read_text().splitlines()
        if ln.startswith("PATH=") and "models serve" in ln
    )
    assert f"models:/{MODEL}@champion" in line and "-p 5001" in line
    (sweep_dir / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the folder a clone runs it from
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    log = open(sweep_dir / "serve.log", "w")
    proc = subprocess.Popen(
        ["bash", "-c", line.replace("-p 5001", f"-p {port}")],
        cwd=sweep_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/ping", proc, sweep_dir / "serve.log", timeout=180)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def _raw_test_rows(sweep) -> tuple[np.ndarray, np.ndarray]:
    """The champion's raw MNIST-1D test rows and labels: generated and split as the loader does, from its config."""
    import mlflow

    from calib_core.config import RunConfig
    from calib_core.data.mnist1d import generate_mnist1d
    from calib_core.data.splits import train_val_test_indices

    mlflow.set_tracking_uri(f"sqlite:///{sweep['dir']}/mlflow.db")
    run_id = sweep["parent"].data.tags["calib.champion_run"]
    cfg = RunConfig.model_validate(mlflow.artifacts.load_dict(f"runs:/{run_id}/run_config.json"))
    assert cfg.data.name == "mnist1d"
    x, y = generate_mnist1d(cfg.data.num_samples, cfg.seed)
    test = train_val_test_indices(
        len(y), val_fraction=cfg.data.val_fraction, test_fraction=cfg.data.test_fraction, seed=cfg.seed, labels=y
    )[2].numpy()
    return x[test], y[test]


def test_the_served_champions_sets_have_the_reported_test_coverage(sweep):
    import mlflow

    x, y = _raw_test_rows(sweep)
    champion = sweep["board"][sweep["board"]["champion"].astype(bool)].iloc[0]
    mlflow.set_tracking_uri(f"sqlite:///{sweep['dir']}/mlflow.db")
    spec = mlflow.models.get_model_info(f"models:/{MODEL}@champion").metadata["calib_core_spec"]
    q = spec["conformal"]["quantiles"]["lac"][repr(ALPHA)]
    with _served(sweep["dir"]) as url:
        status, body = _post(f"{url}/invocations", {"inputs": x.tolist(), "params": {"alpha": ALPHA}})
        assert status == 200, body
        sets = body["predictions"]
        status, body = _post(f"{url}/invocations", {"inputs": x.tolist()})  # no params: probabilities
        assert status == 200, body
        probs = np.asarray(body["predictions"])
    assert len(sets) == len(y) and probs.shape == (len(y), 10)
    assert all(isinstance(s, list) for s in sets) and {c for s in sets for c in s} <= {str(k) for k in range(10)}
    # LAC at the stored quantile, on the served probabilities: the sets the server answered (class k named "k")
    assert sets == [[str(k) for k in np.flatnonzero(1 - p <= q)] for p in probs]
    covered = np.mean([str(label) in s for label, s in zip(y, sets, strict=True)])
    size = np.mean([len(s) for s in sets])
    # exactly the report's numbers, unless a label's score sits within float rounding of the quantile
    border = int((np.abs(1 - probs - q) < BORDER).any(axis=1).sum())
    assert abs(covered - champion["test_cp_lac_a10_coverage"]) * len(y) <= border + 1e-9, (covered, champion)
    assert abs(size - champion["test_cp_lac_a10_size"]) * len(y) <= border + 1e-9, (size, champion)
    print(
        f"champion {champion['trial_id']}: served coverage {float(covered)!r}, size {float(size)!r}; reported "
        f"{float(champion['test_cp_lac_a10_coverage'])!r}, {float(champion['test_cp_lac_a10_size'])!r}; "
        f"{border} borderline rows"
    )
