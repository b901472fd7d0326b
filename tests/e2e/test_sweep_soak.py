"""Soak (issue #36, fault 5): 120 tiny trials, 4 at a time, on the local Ray cluster while a seeded chaos thread
SIGKILLs a random trial worker every 2.5-6.5 s (20 kills), the driver's memory sampled every second
(benchmarks/perf/soak.py, whose own run, 200 trials with a kill every 4-10 s, keeps the figures in
benchmarks/results/soak.json and soak.{csv,png}). The test's 120 trials and denser kills (issue #47 item 4: the
slow tier's longest test, 381-503 s with 200 trials) keep its 20 kills and every check in about 60 % of the time.

Every trial must end with exactly one MLflow run, every epoch logged exactly once on it (no step lost, none
repeated by a retry), the parent run FINISHED, the champion registered as exactly one model version, Ray
Tune's retries must match the kills, and the driver's memory must stay flat over the trial phase. The kills
hit whatever a trial is doing at that moment (training, evaluating, logging, checkpointing), so this covers
timing windows the single-kill fault test does not.
"""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.perf.soak import figures, run_soak, table
from tests.sweep_helpers import store, sweep_runs

pytestmark = pytest.mark.slow

TRIALS, CONCURRENT, EPOCHS, KILLS = 120, 4, 2, 20
KILL_EVERY_S = (2.5, 6.5)


def test_soak_random_worker_kills_exactly_once(tmp_path):
    soak = run_soak(tmp_path, TRIALS, CONCURRENT, EPOCHS, KILLS, seed=7, timeout_s=2400, kill_every_s=KILL_EVERY_S)
    figs = figures(soak, TRIALS, CONCURRENT, EPOCHS)
    print("soak:\n" + table(figs))
    assert soak.returncode == 0, soak.output[-5000:]
    assert len(soak.kills) == KILLS, f"the killer found too few trial processes to kill: {soak.kills}"
    # Every kill costs its trial one retry; a worker killed after its trial's final result may cost none; Ray Tune
    # counts a death twice when it kills a trial while it restores (the service then resumes that trial itself:
    # sweeps/integrations/ray/tuner.py fit_resuming_lost_workers), one more failure each.
    after_final = sum(k["after_final"] for k in soak.kills)
    assert KILLS - after_final <= soak.retries <= KILLS + soak.lost_worker_trials, (soak.retries, figs, soak.kills)
    # The driver's memory over the trial phase: no growth beyond Tune's per-trial records (about 0.5 MB per
    # trial without kills, benchmarks/results/scale.md); a leak per kill or per retry would show here. The level it
    # grows from is the closing's imports, which the warm-up (sweeps/closing_warmup.py) makes as the trials start:
    # measured at 57a18c4 with the benchmark, one run each, 200 trials: first trial 1016 MB with it and 325 MB without
    # (CALIB_CLOSING_WARMUP=0), growth to the last trial 129 and 131 MB, peak 1416 and 1173 MB.
    assert figs["rss_slope_mb_per_100_trials"] < 100, figs
    assert figs["rss_end_of_trials_mb"] - figs["rss_first_trial_mb"] < 250, figs
    assert figs["rss_peak_mb"] < 2000, figs

    client = store(tmp_path)
    parents, children = sweep_runs(client, "soak")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    trial_ids = Counter(r.data.tags["calib.trial_id"] for r in children)
    assert len(children) == TRIALS and all(n == 1 for n in trial_ids.values()), trial_ids
    for run in children:
        assert run.info.status == "FINISHED", run.data.tags.get("calib.failure_reason")
        for key in ("epoch_time", "val_ece", "val_accuracy"):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert sorted(steps) == list(range(1, EPOCHS + 1)), (run.data.tags["calib.trial_id"], key, steps)
    versions = client.search_model_versions("name = 'calibrated-digits'")
    assert len(versions) == 1, [(v.version, v.run_id) for v in versions]
    champion = client.get_model_version_by_alias("calibrated-digits", "champion")
    assert champion.run_id in {r.info.run_id for r in children}
