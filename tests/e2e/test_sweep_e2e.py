"""End to end on CPU: `launch.py --num-samples 4` in a fresh directory, then inspect what it left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sweep_helpers import (
    ARTIFACTS,
    FAST,
    chromium_paths,
    headless_chromium,
    launch,
    mlflow_server,
    optuna_dashboard,
    store,
    sweep_runs,
)

# whole sweeps: the e2e tier (make test-slow), not the unit tier (make test)
pytestmark = pytest.mark.slow

MODEL = "calibrated-mnist1d"  # the default name follows the data


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep")
    # a status table at most every 20 s (30 s by default), so that this short sweep shows one or more
    proc = launch(d, "--num-samples", "4", "--name", "e2e", "--seed", "0", *FAST, env={"CALIB_SWEEP_STATUS_S": "20"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (d / "stdout.txt").write_text(proc.stdout)
    (d / "stderr.txt").write_text(proc.stderr)
    return d


@pytest.fixture(scope="module")
def ui_url(sweep_dir) -> Iterator[str]:
    """One MLflow server on the sweep's store for the tests that open its UI in Chromium (they only read it; one
    server start instead of one per test)."""
    with mlflow_server(f"sqlite:///{sweep_dir}/mlflow.db", sweep_dir / "mlartifacts") as url:
        yield url


def test_terminal_output_is_made_for_people(sweep_dir):
    """The demo config (tiny settings) prints a short, plain report: no per-trial result boxes, no
    TensorBoard hint, no checkpoint lines, no colour codes or progress bars, nothing on stderr."""
    out, err = (sweep_dir / "stdout.txt").read_text(), (sweep_dir / "stderr.txt").read_text()
    lines = (out + err).splitlines()
    assert len(lines) < 120, len(lines)
    # nothing on stderr but Ray's own notice when a raylet is slow to stop on a loaded machine
    stray = [ln for ln in err.splitlines() if ln.strip() and "Raylet is terminated" not in ln]
    assert not stray, err[-3000:]
    for line in lines:
        assert not re.search("[\u2500-\u257f]", line), line  # box drawing (Tune's new-style tables)
        for noise in (
            "TensorBoard",
            "Checkpoint successfully created",
            "\x1b[",
            "Downloading artifacts",
            "A new study created",
            "Token authentication",
        ):
            assert noise not in line, line
    # Tune's status table with the calibrator, its lr and the headline metrics (when the trials ran for 20 s)
    # (metric columns appear once a trial has reported)
    for header in (ln for ln in out.splitlines() if re.match(r"\|\s*Trial name", ln)):
        assert re.search(r"\| calibrator\s+\|\s+lr\s+\|", header), header
        if "epoch" in header:
            assert re.search(r"\|\s+epoch\s+\|\s+val acc\s+\|\s+val ECE\s+\|", header), header
    # one progress line per trial: done / total, elapsed, time left
    assert re.search(r"^\[1/4 trials done, \d+:\d\d elapsed, about \d+:\d\d left\] ", out, re.M), out[:3000]
    assert re.search(r"^\[4/4 trials done, \d+:\d\d elapsed\] ", out, re.M)
    assert out.index("Leaderboard") < out.index("Selection: ") < out.index("Registered: ")
    # the selection in at most four lines (champion, trade, rule, winning family); the rule's and the family's lines
    # state the criterion and its counts in full (issue #45: every printed number recomputable), so up to ~400
    # characters; the rank matrix only with --verbose (one summary line here)
    sel = out[out.index("Selection: ") : out.index("Registered: ")].strip().splitlines()
    assert 1 <= len(sel) <= 4 and all(len(ln) <= 420 for ln in sel), [len(ln) for ln in sel]
    # the count it names is the leaderboard's completed candidates (each trial, and + TS), not the trials
    ranked = re.search(r"Rank agreement between metrics \(Spearman over (\d+) candidates\): lowest", out)
    board = out[out.index("Leaderboard") : out.index("Rank agreement")].splitlines()[2:]
    assert ranked and int(ranked.group(1)) == sum(" completed " in ln for ln in board), out[-3000:]
    assert "candidates (Spearman):" not in out  # the matrix is --verbose's
    assert "optuna-dashboard sqlite:///" in out


def test_store_holds_one_parent_and_four_children(sweep_dir):
    parents, children = sweep_runs(store(sweep_dir), "e2e")
    assert len(parents) == 1 and len(children) == 4
    assert parents[0].info.status == "FINISHED"
    for run in children:
        assert run.info.status == "FINISHED", run.data.tags
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        for key in ("val_accuracy", "val_ece", "val_sce", "val_ace", "test_accuracy", "test_ece"):
            assert key in run.data.metrics, key
        assert 0.0 < run.data.metrics["val_accuracy"] <= 1.0
        assert run.data.params["train.epochs"] == "2"
        for tag in ("calib.trial_id", "calib.git_commit", "calib.dataset", "calib.calibrator"):
            assert run.data.tags.get(tag), tag
        history = store(sweep_dir).get_metric_history(run.info.run_id, "epoch_time")
        assert sorted(m.step for m in history) == [1, 2]


def test_mlflow_conventions(sweep_dir):
    """Standard tags: source commit, run descriptions (parent: the sweep, the champion linked by run id and
    the selection sentence; trials: what they train and their result); a classic-ML experiment."""
    client = store(sweep_dir)
    parents, children = sweep_runs(client, "e2e")
    parent = parents[0]
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    for run in (parent, *children):
        assert re.fullmatch("[0-9a-f]{40}", run.data.tags["mlflow.source.git.commit"])
        assert run.data.tags["calib.git_commit"] == run.data.tags["mlflow.source.git.commit"]
        assert run.data.tags.get("mlflow.user") and run.data.tags.get("mlflow.source.type") == "LOCAL"
    note = parent.data.tags["mlflow.note.content"]
    champion_run = parent.data.tags["calib.champion_run"]
    assert "Sweep **e2e**" in note and "Selection:" in note
    assert f"(#/experiments/{exp.experiment_id}/runs/{champion_run})" in note and "@champion" in note
    for run in children:
        text = run.data.tags["mlflow.note.content"]
        assert f"of sweep [e2e](#/experiments/{exp.experiment_id}/runs/{parent.info.run_id})" in text
        # one-go: "calibrator `vector`"; the reference arm: "the reference arm `ce_es`"
        assert f"`{run.data.tags['calib.calibrator']}`" in text and "**Result:** val accuracy" in text


def test_artifacts_on_runs(sweep_dir):
    client = store(sweep_dir)
    parents, children = sweep_runs(client, "e2e")
    names = {a.path for a in client.list_artifacts(parents[0].info.run_id, "sweep")}
    assert {
        "sweep/leaderboard.csv",
        "sweep/pareto.png",
        "sweep/rank_agreement_spearman.csv",
        "sweep/selection.json",
    } <= names
    diagrams = {a.path for a in client.list_artifacts(children[0].info.run_id, "diagrams")}
    assert {"diagrams/reliability_val.png", "diagrams/reliability_test.png"} <= diagrams


def test_champion_registered_and_printed(sweep_dir):
    client = store(sweep_dir)
    mv = client.get_model_version_by_alias(MODEL, "champion")
    parents, children = sweep_runs(client, "e2e")
    champion_trial = parents[0].data.tags["calib.champion_trial"]
    champion = [r for r in children if r.data.tags["calib.trial_id"] == champion_trial][0]
    assert mv.tags.get("source_run_id") == champion.info.run_id
    out = (sweep_dir / "stdout.txt").read_text()
    assert "Leaderboard" in out and "mlflow ui --backend-store-uri sqlite:///" in out
    # the default rule since selection_v4 (benchmarks/results/selection_v4.md)
    assert "Selection: " in out and "Rule: the most accurate of the " in out and "temperature scaling on top" in out
    assert "Trade: " in out and "References: CE with early stopping" in out
    assert "val ECE" in out.split("Selection: ")[1] and "[" in out.split("Selection: ")[1]


def test_intervals_predictions_and_selection_record(sweep_dir):
    """Each child keeps its predictions and CI bounds; the parent's selection.json and leaderboard carry them."""
    import numpy as np
    import pandas as pd

    client = store(sweep_dir)
    parents, children = sweep_runs(client, "e2e")
    for run in children:
        m = run.data.metrics
        for key in ("val_ece", "val_accuracy", "test_ece", "val_ace", "val_aurc"):
            assert m[f"{key}_ci_low"] <= m[key] + 1e-9 and m[key] <= m[f"{key}_ci_high"] + 1e-9, key
        for key in ("val_smooth_ece", "val_ece_sweep", "val_debiased_l2_ce", "test_smooth_ece"):
            assert key in m, key
        # temperature scaling on top: the trial's second candidate, on the same run, with its own intervals
        assert m["ts_temperature"] > 0 and m["ts_val_accuracy"] == pytest.approx(m["val_accuracy"], abs=1e-12)
        assert m["ts_val_ece_ci_low"] <= m["ts_val_ece"] + 1e-9 <= m["ts_val_ece_ci_high"] + 2e-9
        preds = client.download_artifacts(run.info.run_id, "predictions/predictions.npz", str(sweep_dir))
        with np.load(preds) as z:
            assert z["val_probs"].shape[0] == z["val_labels"].shape[0]
            np.testing.assert_allclose(z["val_probs"].sum(1), 1.0, atol=1e-5)
    pid = parents[0].info.run_id
    sel = json.loads(Path(client.download_artifacts(pid, "sweep/selection.json", str(sweep_dir))).read_text())
    assert sel["rule"] == "most_accurate_ts" and sel["champion_run"] == parents[0].data.tags["calib.champion_run"]
    assert sel["max_accuracy_loss_pt"] is None and sel["family"].endswith("+ TS")
    lo, hi = sel["intervals"]["val_ece"]
    assert lo <= sel["val_metrics"]["val_ece"] <= hi
    board = pd.read_csv(client.download_artifacts(pid, "sweep/leaderboard.csv", str(sweep_dir)))
    assert {"calibrator", "calibrator_lr", "champion", "not_worse_than_champion", "val_ece_ci_low"} <= set(board)
    assert board["champion"].sum() == 1


def test_champion_loads_in_fresh_process_and_matches_logged_test_ece(sweep_dir):
    client = store(sweep_dir)
    mv = client.get_model_version_by_alias(MODEL, "champion")
    logged = client.get_run(mv.tags["source_run_id"]).data
    script = f"""
import json, mlflow, numpy as np
from calib_core.config import RunConfig
from calib_core.data import load_dataset
from calib_core.metrics import ece
mlflow.set_tracking_uri("sqlite:///{sweep_dir}/mlflow.db")
model = mlflow.pyfunc.load_model("models:/{MODEL}@champion")
raw = mlflow.artifacts.load_dict("runs:/{mv.tags["source_run_id"]}/run_config.json")
cfg = RunConfig.model_validate(raw)
data = load_dataset(cfg.data, cfg.seed)
probs = model.predict(data.test.x.numpy(), params={{"inputs": "standardised"}})
assert np.allclose(probs.sum(1), 1.0, atol=1e-6)
print(json.dumps({{"ece": float(ece(probs, data.test.y.numpy(), num_bins=cfg.train.num_bins))}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=sweep_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])["ece"]
    # a "+ TS" champion is served with its temperature on top: its logged test ECE is the ts_ one
    parent = sweep_runs(client, "e2e")[0][0]
    key = "ts_test_ece" if parent.data.tags["calib.champion_candidate"].endswith("+ts") else "test_ece"
    assert got == pytest.approx(logged.metrics[key], abs=1e-5)


def test_selection_reproducible_with_same_seed(sweep_dir):
    proc = launch(sweep_dir, "--num-samples", "4", "--name", "e2e-again", "--seed", "0", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = store(sweep_dir)

    def champion(sweep):
        parents, children = sweep_runs(client, sweep)
        tid = parents[0].data.tags["calib.champion_trial"]
        run = [r for r in children if r.data.tags["calib.trial_id"] == tid][0]
        return run.data.tags["calib.label"], run.data.metrics["val_ece"], run.data.metrics["val_accuracy"]

    first, second = champion("e2e"), champion("e2e-again")
    assert first[0] == second[0]
    assert first[1:] == pytest.approx(second[1:], abs=1e-9)


def test_same_name_without_resume_is_refused(sweep_dir):
    proc = launch(sweep_dir, "--num-samples", "4", "--name", "e2e", *FAST)
    assert proc.returncode != 0
    assert "already exists" in proc.stderr and "--resume" in proc.stderr
    assert len(sweep_runs(store(sweep_dir), "e2e")[1]) == 4


def _chromium() -> tuple[str, str]:
    paths = chromium_paths()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("chromium/chromedriver missing in CI: .ci/run installs Debian's chromium packages")
        pytest.skip("Debian chromium + chromium-driver not installed")
    return paths


def test_optuna_study_in_sqlite_beside_mlflow_store(sweep_dir):
    """One study per sweep name in ./optuna.db, every trial told, linked to its Tune trial and MLflow run."""
    import optuna

    study = optuna.load_study(study_name="e2e", storage=f"sqlite:///{sweep_dir}/optuna.db")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert study.metric_names == ["val_accuracy", "val_ece"]
    assert study.best_trials, "an empty Pareto front"
    _, children = sweep_runs(store(sweep_dir), "e2e")
    by_trial = {r.data.tags["calib.trial_id"]: r for r in children}
    for t in trials:
        run = by_trial[t.user_attrs["tune_trial_id"]]
        assert t.values[0] == pytest.approx(run.data.metrics["val_accuracy"], abs=1e-9)
        # the reference arm (CE with early stopping) is the study's first trial, a constant rather than a draw
        assert t.params.get("calibrator", t.user_attrs.get("reference_arm")) == run.data.tags["calib.calibrator"]
        assert ("reference_arm" in t.user_attrs) == (t.number == 0)
        assert t.user_attrs["mlflow_run_id"] == run.info.run_id  # the tools are linked both ways
    (parent,), _ = sweep_runs(store(sweep_dir), "e2e")
    champion = parent.data.tags["calib.champion_trial"]
    assert study.user_attrs["champion_tune_trial_id"] == champion
    number = study.user_attrs["champion_trial_number"]
    assert [t.user_attrs["tune_trial_id"] for t in trials if t.number == number] == [champion]


def test_optuna_dashboard_shows_trials_and_pareto_front(sweep_dir):
    """`optuna-dashboard sqlite:///.../optuna.db` (the README's command): the study page in headless Chromium
    shows the Pareto front with one point per trial, the trials page lists every trial with its calibrator."""
    import urllib.request

    import optuna

    paths = _chromium()
    url = f"sqlite:///{sweep_dir}/optuna.db"
    study = optuna.load_study(study_name="e2e", storage=url)
    sid = study._study_id
    front = {t.number for t in study.best_trials}
    ARTIFACTS.mkdir(exist_ok=True)
    with optuna_dashboard(url, sweep_dir) as base:
        info = json.loads(urllib.request.urlopen(f"{base}/api/studies/{sid}", timeout=30).read())
        assert len(info["trials"]) == 4
        assert {t["number"] for t in info["best_trials"]} == front
        with headless_chromium(paths, "1400,1800") as driver:
            driver.get(f"{base}/dashboard/studies/{sid}")
            deadline = time.time() + 90
            points = 0
            while time.time() < deadline:
                text = driver.find_element("tag name", "body").text
                plots = driver.find_elements("css selector", ".js-plotly-plot")
                if "Pareto Front" in text and plots:  # the first plot on the study page is the front
                    points = len(plots[0].find_elements("css selector", ".scatterlayer .point"))
                    if points >= 4 and "val_ece" in text:
                        break
                time.sleep(0.5)
            time.sleep(1)
            shot = sweep_dir / "optuna_dashboard_pareto.png"
            driver.save_screenshot(str(shot))
            (ARTIFACTS / shot.name).write_bytes(shot.read_bytes())
            assert "Pareto Front" in text and points >= 4, (points, text[:2000])
            assert "val_accuracy" in text and "val_ece" in text  # the objectives' names, not "Objective 0"
            driver.get(f"{base}/dashboard/studies/{sid}/trials")
            deadline = time.time() + 60
            while time.time() < deadline:
                text = driver.find_element("tag name", "body").text
                # the first trial shown is the reference arm: a user attribute, no sampled calibrator
                if all(f"Trial {t.number}" in text for t in study.trials) and (
                    "calibrator" in text or "reference_arm" in text
                ):
                    break
                time.sleep(0.5)
            shot = sweep_dir / "optuna_dashboard_trials.png"
            driver.save_screenshot(str(shot))
            (ARTIFACTS / shot.name).write_bytes(shot.read_bytes())
    for t in study.trials:
        assert f"Trial {t.number}" in text, text[:2000]
    assert ("calibrator" in text or "reference_arm ce_es" in text) and "Complete" in text


def test_mlflow_ui_compare_view_shows_the_sweep(sweep_dir, ui_url):
    paths = _chromium()
    client = store(sweep_dir)
    parents, children = sweep_runs(client, "e2e")
    exp_id = children[0].info.experiment_id
    ids = [r.info.run_id for r in children]
    ARTIFACTS.mkdir(exist_ok=True)
    with headless_chromium(paths, "1600,3200") as driver:
        driver.get(
            f"{ui_url}/#/compare-runs?runs={json.dumps(ids).replace(' ', '')}"
            f"&experiments={json.dumps([exp_id]).replace(' ', '')}"
        )
        names = [r.info.run_name for r in children]
        deadline = time.time() + 60
        text = ""
        while time.time() < deadline:
            text = driver.find_element("tag name", "body").text
            if f"Comparing {len(ids)} Runs" in text and all(n in text for n in names):
                break
            time.sleep(0.5)
        # The metrics table is a virtualised grid: scroll it until the accuracy and ECE rows render.
        metric_rows = _scroll_metrics_grid(driver, ("val_accuracy", "val_ece"))
        driver.save_screenshot(str(ARTIFACTS / "mlflow_compare.png"))
    assert f"Comparing {len(ids)} Runs" in text
    for name in names:
        assert name in text
    assert {"val_accuracy", "val_ece"} <= metric_rows


def _scroll_metrics_grid(driver, wanted: tuple[str, ...]) -> set[str]:
    """Scroll MLflow's virtualised grids (the metrics table: its names' column and its values, ~280 rows a trial, so
    val_ece is some 250 rows down) page by page to their end; return the wanted names seen as a cell's whole text."""
    found: set[str] = set()
    for step in range(400):
        done = driver.execute_script(
            "const gs=[...document.querySelectorAll('.ReactVirtualized__Grid')]; let done=true;"
            "for (const g of gs) { g.scrollTop = arguments[0] * g.clientHeight * 0.8;"
            " g.dispatchEvent(new Event('scroll'));"
            " done = done && g.scrollTop + g.clientHeight >= g.scrollHeight - 1; }"
            "return done;",
            step,
        )
        time.sleep(0.2)
        cells = driver.execute_script(
            "return [...document.querySelectorAll('.ReactVirtualized__Grid *')].map(e=>e.textContent.trim());"
        )
        found |= set(wanted) & set(cells)
        if found == set(wanted) or done:
            break
    return found


def test_printed_mlflow_link_opens_the_classic_runs_view(sweep_dir, ui_url):
    """The 'Compare runs' line's page (MLflow 3.17 opens experiments in its GenAI view unless the URL asks for
    the classic one) shows the runs table with the sweep's runs in headless Chromium; the parent's description
    carries the same page and the dashboard command."""
    paths = _chromium()
    out = (sweep_dir / "stdout.txt").read_text()
    m = re.search(r"then open http://127\.0\.0\.1:5000/(#/experiments/\d+\?workflowType=machine_learning)\)", out)
    assert m, out[-2000:]
    page = m.group(1)
    client = store(sweep_dir)
    (parent,), children = sweep_runs(client, "e2e")
    note = parent.data.tags["mlflow.note.content"]
    assert page in note and "optuna-dashboard sqlite:///" in note
    with headless_chromium(paths, "1600,1200") as driver:
        driver.get(f"{ui_url}/{page}")
        deadline, text = time.time() + 60, ""
        while time.time() < deadline:
            text = driver.find_element("tag name", "body").text
            if "Run Name" in text and parent.info.run_name in text:
                break
            time.sleep(0.5)
        shot = sweep_dir / "mlflow_runs_view.png"
        driver.save_screenshot(str(shot))
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / shot.name).write_bytes(shot.read_bytes())
        assert "/runs" in driver.current_url and "workflowType=machine_learning" in driver.current_url
    assert "Run Name" in text and parent.info.run_name in text, text[:2000]
    assert "No data available for the selected time range" not in text  # the GenAI overview's empty charts


def test_sweep_report_is_one_offline_page_with_everything_drawn(sweep_dir):
    """The HTML report (printed path, and sweep/report.html on the parent run) opened from disk in headless Chromium:
    no script and no remote resource; the leaderboard row per trial, parallel coordinates with a line per
    completed trial (champion in red) and a log-lr axis, importances, the Pareto plot and reliability diagrams
    drawn; the selection sentences and the MLflow link in the classic view. Saves a screenshot."""
    paths = _chromium()
    out = (sweep_dir / "stdout.txt").read_text()
    m = re.search(r"^Report: (\S+report\.html)$", out, flags=re.M)
    assert m, out[-2000:]
    report = Path(m.group(1))
    assert report.is_file() and report.parent == sweep_dir / "ray_results" / "e2e"
    text = report.read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)=["'](https?:)?//(?!127\.0\.0\.1)""", text)  # nothing fetched from elsewhere
    client = store(sweep_dir)
    (parent,), children = sweep_runs(client, "e2e")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    assert "sweep/report.html" in logged
    completed = [c for c in children if c.data.tags.get("calib.status") == "completed"]
    champion_label = next(
        c.data.tags["calib.label"]
        for c in children
        if c.data.tags["calib.trial_id"] == parent.data.tags["calib.champion_trial"]
    )
    with headless_chromium(paths, "1400,3200") as driver:
        driver.get(report.as_uri())
        time.sleep(1)
        body = driver.find_element("tag name", "body").text
        rows = driver.find_elements("css selector", "table.leaderboard tr")
        lines = driver.find_elements("css selector", "svg.parcoords polyline.trial")
        champ = [
            e.get_attribute("stroke") for e in driver.find_elements("css selector", "svg.parcoords polyline.champion")
        ]
        titles = [e.text for e in driver.find_elements("css selector", "svg.parcoords text.axis-title")]
        widths = driver.execute_script("return Array.from(document.images).map(i => [i.className, i.naturalWidth])")
        importance = driver.find_elements("css selector", "tr.importance")
        links = [a.get_attribute("href") for a in driver.find_elements("css selector", "a.mlflow, a.run")]
        shot = sweep_dir / "sweep_report.png"
        driver.save_screenshot(str(shot))
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / shot.name).write_bytes(shot.read_bytes())
    # a row per candidate (each trial as trained and + TS); a line per completed trial with a calibrator lr (the
    # reference arm has none), the champion's trial in red
    assert len(rows) == 1 + 2 * len(children)
    with_lr = [c for c in completed if c.data.tags["calib.calibrator"] != "ce_es"]
    champion_trial = parent.data.tags["calib.champion_trial"]
    assert len(lines) == len(with_lr)
    assert champ == (["#d62728"] if any(c.data.tags["calib.trial_id"] == champion_trial for c in with_lr) else [])
    assert titles == ["calibrator", "log10 calibrator_lr", "val accuracy", "val ECE"], titles
    assert all(w > 100 for _, w in widths) and {c for c, _ in widths} >= {"pareto", "reliability"}, widths
    # fANOVA over the sampled trials only (the reference arm is not part of the space): 3 of 4 here, too few
    sampled = [c for c in children if c.data.tags["calib.calibrator"] != "ce_es"]
    if len(sampled) >= 4:
        assert len(importance) >= 2 * 2  # calibrator and calibrator_lr, for each objective
    else:
        assert not importance and "completed sampled trials: too few for parameter importances" in body
    assert champion_label in body and "Rule:" in body and "95 % paired bootstrap intervals" in body
    assert any(h and h.endswith("?workflowType=machine_learning") for h in links), links
    run_links = [h for h in links if h and "/runs/" in h]  # a row per candidate, each linking its trial's run
    assert len(run_links) == 2 * len(children) and len(set(run_links)) == len(children)
