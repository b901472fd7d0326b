"""Sweep CLI and config validation: bad input fails early, in one line, naming the field."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from calib_core.config import ConfigError
from sweeps.cli import build_parser, main
from sweeps.config import load_sweep_config
from sweeps.integrations.optuna.search_space import SearchSpace
from sweeps.trial_params import resolve_run_config
from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"

# (id, extra CLI args, YAML text or None, substring the one-line message must contain)
BAD_CASES = [
    ("wrong-type", ["--set", "run.train.epochs=many"], None, "run.train.epochs"),
    ("unknown-key", ["--set", "run.train.epochz=3"], None, "run.train.epochz: unknown key"),
    ("unknown-top-key", [], "name: x\nfoo: 1\n", "foo: unknown key"),
    ("negative-cpus", ["--cpus-per-trial", "-1"], None, "resources.cpus_per_trial"),
    ("negative-gpus", ["--gpus-per-trial", "-0.5"], None, "resources.gpus_per_trial"),
    ("zero-samples", ["--num-samples", "0"], None, "search.num_samples"),
    ("unknown-calibrator", ["--set", "search.calibrators=[temperature,platt]"], None, "unknown calibrator 'platt'"),
    ("unknown-dataset", ["--set", "run.data.name=imagenet"], None, "run.data.name"),
    ("bad-calibrator-data", ["--set", "run.train.calibrator_data=holdout:2"], None, "run.train.calibrator_data"),
    ("bad-tracking-uri", ["--tracking-uri", "ftp://example/mlflow"], None, "tracking.uri"),
    ("bad-storage-uri", ["--storage-path", "ftp://bucket/x"], None, "storage_path"),
    (
        "bad-lr-range",
        ["--set", "search.calibrator_lr.low=0.1", "--set", "search.calibrator_lr.high=0.01"],
        None,
        "search.calibrator_lr",
    ),
    ("asha-multi", ["--set", "search.scheduler=asha"], None, "asha"),
    ("bad-metric", ["--set", "search.metric=test_ece", "--set", "search.objective=single"], None, "search.metric"),
    ("bad-name", ["--name", "my sweep!"], None, "name"),
    (
        "shift-metric-without-shift",
        ["--set", "search.objective=single", "--set", "search.metric=val_shift_ece"],
        None,
        "evaluation.shift",
    ),
    (
        "shift-accuracy-without-shift",
        [
            "--set",
            "selection.rule=min_metric",
            "--set",
            "selection.metric=val_shift_accuracy",
            "--set",
            "selection.mode=max",
        ],
        None,
        "evaluation.shift",
    ),
    (
        "ood-metric-without-ood",
        ["--set", "selection.rule=min_metric", "--set", "selection.metric=val_ood_msp_auroc"],
        None,
        "evaluation.ood",
    ),
    ("unknown-ood-kind", ["--set", "evaluation.ood=svhn"], None, "evaluation.ood"),
    ("bad-override-syntax", ["--set", "run.train.epochs"], None, "expected key=value"),
    ("missing-config-file", ["--config", "does-not-exist.yaml"], None, "config file not found"),
    ("not-a-mapping", [], "- a\n- b\n", "top level must be a mapping"),
    (
        "cluster-local-sqlite",
        ["--cluster", "--tracking-uri", "sqlite:////tmp/x.db", "--storage-path", "s3://b/p"],
        None,
        "local store",
    ),
    (
        "cluster-local-storage",
        ["--cluster", "--tracking-uri", "http://mlflow:5000", "--storage-path", "/tmp/r"],
        None,
        "storage_path",
    ),
    ("cluster-no-tracking", ["--cluster", "--storage-path", "s3://b/p"], None, "tracking.uri"),
]


@pytest.mark.parametrize("case_id,args,yaml_text,needle", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_config_one_line_no_traceback_nothing_written(tmp_path, case_id, args, yaml_text, needle):
    cmd = [sys.executable, str(LAUNCH), *args]
    if yaml_text is not None:
        (tmp_path / "cfg.yaml").write_text(yaml_text)
        cmd += ["--config", "cfg.yaml"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    assert needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["cfg.yaml"] if yaml_text is not None else [])


def test_several_bad_fields_are_all_named():
    with pytest.raises(ConfigError) as exc:
        load_sweep_config(None, ["run.train.lr=-1", "resources.max_concurrent=0"])
    msg = str(exc.value)
    assert "run.train.lr" in msg and "resources.max_concurrent" in msg


def test_dry_run_prints_resolved_config_and_plan(tmp_path, capsys):
    rc = main(
        [
            "--dry-run",
            "--num-samples",
            "3",
            "--gpus-per-trial",
            "0.25",
            "--max-concurrent",
            "4",
            "--set",
            "run.train.epochs=2",
            "--seed",
            "7",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "num_samples: 3" in out and "epochs: 2" in out
    assert "at most 3 at once" in out and "peak 3 CPU, 0.75 GPU" in out
    assert "seed: 7" in out


def test_default_stores_are_absolute(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"sqlite:///{tmp_path.resolve()}/mlflow.db" in out
    assert f"storage: {tmp_path.resolve()}/ray_results" in out
    assert not (tmp_path / "mlflow.db").exists()


def test_help_explains_every_flag():
    text = build_parser().format_help()
    for flag in (
        "--config",
        "--set",
        "--cluster",
        "--num-samples",
        "--max-concurrent",
        "--gpus-per-trial",
        "--cpus-per-trial",
        "--tracking-uri",
        "--storage-path",
        "--name",
        "--resume",
        "--dry-run",
        "--seed",
    ):
        assert flag in text


def test_every_shipped_config_validates():
    for path in sorted((ROOT / "sweeps" / "configs").glob("*.yaml")):
        cfg = load_sweep_config(path)
        assert cfg.search.num_samples >= 1, path


def test_resolve_maps_choices_to_methods():
    base = load_sweep_config(None).run
    assert resolve_run_config(base, {"calibrator": "none"}).train.method == "ce"
    post = resolve_run_config(base, {"calibrator": "posthoc_matrix"}).train
    assert (post.method, post.posthoc_calibrator) == ("posthoc", "matrix")
    one = resolve_run_config(base, {"calibrator": "last_layer", "calibrator_lr": 0.003, "train.lr": 0.01}).train
    assert (one.method, one.calibrator, one.calibrator_lr, one.lr) == ("onego", "last_layer", 0.003, 0.01)


def test_search_space_is_seeded_and_conditional():
    import optuna

    cfg = load_sweep_config(None, ["search.calibrators=[none,temperature]"])
    space = SearchSpace(cfg.search)

    def draw(seed):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        out = []
        for _ in range(6):
            t = study.ask()
            fixed = space(t) or {}  # the reference arms (first trials) are constants, not draws
            out.append({**fixed, **t.params})
            study.tell(t, 0.0)
        return out

    a, b = draw(3), draw(3)
    assert a == b
    # the first trials are the reference arms, each once: CE with early stopping, then plain CE ('none' is
    # listed and nothing else is searched, so it is run once rather than drawn again)
    assert [p["calibrator"] for p in a[:2]] == ["ce_es", "none"] and a[0]["train.early_stopping_patience"] == 5
    assert all(p["calibrator"] == "temperature" for p in a[2:])
    for params in a:
        assert ("calibrator_lr" in params) == (params["calibrator"] == "temperature")
        if "calibrator_lr" in params:
            assert 1e-4 <= params["calibrator_lr"] <= 1e-1


def test_yaml_config_file_roundtrip(tmp_path):
    (tmp_path / "c.yaml").write_text(
        textwrap.dedent("""
        name: t1
        run: {train: {epochs: 3}}
        search: {num_samples: 2, calibrators: [matrix]}
    """)
    )
    cfg = load_sweep_config(tmp_path / "c.yaml", ["search.calibrator_lr.high=0.5"])
    assert (cfg.name, cfg.run.train.epochs, cfg.search.calibrators, cfg.search.calibrator_lr.high) == (
        "t1",
        3,
        ["matrix"],
        0.5,
    )


def test_searchable_metric_names_follow_calib_core() -> None:
    import torch

    from calib_core import metrics
    from calib_core.evaluation import SPLITS as CORE_SPLITS
    from calib_core.metrics import METRIC_NAMES as CORE
    from calib_core.ood import ood_report
    from sweeps.config import PER_EPOCH_METRICS, SweepConfig
    from sweeps.contract import DEBIASED_METRICS, OOD_METRICS, OOD_SCORES, SPLITS

    assert set(PER_EPOCH_METRICS) == set(CORE)
    assert SPLITS == CORE_SPLITS  # the trial reports calib_core.evaluation.final_metrics' splits
    p = torch.softmax(torch.randn(20, 3, generator=torch.Generator().manual_seed(0)), 1)
    assert {f"ood_{k}" for k in ood_report(p, p.flip(0))} == set(OOD_METRICS)
    assert {k.split("_")[1] for k in OOD_METRICS} == set(OOD_SCORES)
    assert all(callable(getattr(metrics, name, None)) for name in DEBIASED_METRICS)
    for name in ("val_classwise_ece", "val_smooth_ece", "val_ece_sweep", "val_debiased_l2_ce"):
        cfg = SweepConfig.model_validate(
            {"search": {"objective": "single", "metric": name}, "selection": {"metric": name}}
        )
        assert cfg.search.metric == name


def test_selection_never_uses_a_test_metric() -> None:
    from pydantic import ValidationError

    from sweeps.config import SweepConfig

    for bad in ("test_ece", "ece", "val_nope"):
        with pytest.raises(ValidationError, match="must be a validation metric"):
            SweepConfig.model_validate({"selection": {"metric": bad}})
