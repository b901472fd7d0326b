"""The champion gate (issue #24 item 2): sweeps/decide/gate.py against simulations with a known answer, and
every branch of sweeps/integrations/mlflow/champion_gate.move_alias on a real SQLite registry (slow: real
models are trained and registered)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sweeps.decide.gate import compare, held_out_mask, model_inputs, raw_inputs, row_hashes


# ---------------------------------------------------------------------------- the decision, simulated
def _calibrated(rng: np.random.Generator, labels: np.ndarray, acc: float, conf: float, k: int = 10) -> np.ndarray:
    """Probabilities whose top class is right with probability `acc` and whose top probability is `conf`."""
    n = len(labels)
    right = rng.random(n) < acc
    wrong = (labels + rng.integers(1, k, n)) % k
    top = np.where(right, labels, wrong)
    p = np.full((n, k), (1.0 - conf) / (k - 1))
    p[np.arange(n), top] = conf
    return p


def test_equal_models_are_promoted():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 2000)
    d = compare(_calibrated(rng, y, 0.8, 0.8), _calibrated(rng, y, 0.8, 0.8), y)
    assert d.promote, d.reason
    assert d.rows == 2000 and "not significantly" in d.reason
    assert abs(d.new["accuracy"] - 0.8) < 0.03 and abs(d.old["accuracy"] - 0.8) < 0.03


def test_a_less_accurate_model_is_held_back():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 10, 2000)
    d = compare(_calibrated(rng, y, 0.7, 0.7), _calibrated(rng, y, 0.8, 0.8), y)
    assert not d.promote
    assert "significantly less accurate" in d.reason and "worse calibrated" not in d.reason, d.reason


def test_an_over_confident_model_is_held_back():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 10, 2000)
    # the same accuracy, but 0.99 confidence for 80 % accuracy: ECE ~ 19 pt against ~ 0
    d = compare(_calibrated(rng, y, 0.8, 0.99), _calibrated(rng, y, 0.8, 0.8), y)
    assert not d.promote
    assert "worse calibrated" in d.reason and "less accurate" not in d.reason, d.reason
    assert d.new["ece"] > 0.15 > 0.05 > d.old["ece"]


def test_a_better_model_is_promoted():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 10, 2000)
    assert compare(_calibrated(rng, y, 0.9, 0.9), _calibrated(rng, y, 0.8, 0.95), y).promote


def test_too_few_rows_decide_nothing():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 10, 60)
    d = compare(_calibrated(rng, y, 0.9, 0.9), _calibrated(rng, y, 0.5, 0.5), y)
    assert not d.promote and "only 60 rows" in d.reason


def test_false_alarm_rate_is_near_the_level():
    """Equal models: the gate holds back about 2 x 5 % of them (two one-sided tests), not more."""
    held = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        y = rng.integers(0, 10, 600)
        held += not compare(
            _calibrated(rng, y, 0.8, 0.8), _calibrated(rng, y, 0.8, 0.8), y, num_resamples=300, seed=seed
        ).promote
    assert held <= 10, held  # expected ~4 of 40; 10 would be a 25 % false-alarm rate


# ---------------------------------------------------------------------------- rows across standardisations
@pytest.mark.parametrize(
    "stats",
    [{"mean": [0.3], "std": [2.0]}, {"scale": 1.0 / 16.0}, {"mean": [0.1, -0.2, 0.5], "std": [1.0, 3.0, 0.5]}, {}],
)
def test_inputs_round_trip_through_the_raw_values(stats):
    rng = np.random.default_rng(5)
    shape = (50, 3, 8) if len(stats.get("mean", [])) == 3 else (50, 40)
    raw = np.round(rng.normal(size=shape) * 4, 3)
    x = model_inputs(raw, stats)
    assert x.dtype == np.float32
    back = raw_inputs(x, stats)
    assert np.allclose(back, raw, atol=1e-4)
    assert np.array_equal(row_hashes(back), row_hashes(raw))


def test_unknown_standardisation_is_refused():
    x = np.zeros((3, 4), dtype=np.float32)
    assert raw_inputs(x, {"min": 0, "max": 1}) is None
    assert model_inputs(x, {"quantiles": [1, 2]}) is None


def test_rows_seen_by_the_champion_are_excluded():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(30, 5)), rng.normal(size=(20, 5))
    seen = row_hashes(np.concatenate([a[:10], b]))
    keep = held_out_mask(row_hashes(a), seen)
    assert keep.tolist() == [False] * 10 + [True] * 20
    # one standardisation on one side, another on the other: still the same rows
    s1, s2 = {"mean": [1.0], "std": [2.0]}, {"mean": [-0.5], "std": [0.7]}
    assert np.array_equal(
        row_hashes(raw_inputs(model_inputs(a, s1), s1)), row_hashes(raw_inputs(model_inputs(a, s2), s2))
    )


# ---------------------------------------------------------------------------- the registry, every branch
MODEL = "gated-classifier"


def _checkpoint(d: Path, name: str, data_cfg: dict, epochs: int, lr: float) -> SimpleNamespace:
    """A trained model written as a trial's final checkpoint, with the test predictions a trial stores."""
    import torch

    from calib_core.config import RunConfig
    from calib_core.data import load_dataset
    from calib_core.trainer import make_trainer
    from tests.unit.sweeps.test_model_export import write_checkpoint

    torch.manual_seed(0)
    torch.set_num_threads(1)
    arch = "cnn1d" if data_cfg["name"] == "mnist1d" else "mlp"
    cfg = RunConfig.model_validate(
        {
            "data": data_cfg,
            "model": {"name": arch},
            "train": {"calibrator": "temperature", "epochs": epochs, "lr": lr, "batch_size": 64},
            "device": "cpu",
            "num_threads": 1,
        }
    )
    data = load_dataset(cfg.data, cfg.seed)
    result = make_trainer(cfg, data, "cpu").fit()
    ckpt = d / name
    write_checkpoint(ckpt, cfg, data, result)
    module = result.model.eval()
    with torch.no_grad():
        probs = torch.softmax(module(data.test.x).double(), dim=-1).numpy()
    np.savez(ckpt / "predictions.npz", test_probs=probs, test_labels=data.test.y.numpy())
    acc = float((probs.argmax(1) == data.test.y.numpy()).mean())
    return SimpleNamespace(ckpt=ckpt, cfg=cfg, data=data, acc=acc)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow.store import MlflowStore

    d = tmp_path_factory.mktemp("gate")
    uri = f"sqlite:///{d.resolve()}/mlflow.db"
    mnist = {"name": "mnist1d", "num_samples": 3000}
    models = {
        "good": _checkpoint(d, "good", mnist, epochs=6, lr=3e-3),
        "bad": _checkpoint(d, "bad", mnist, epochs=1, lr=1e-5),
        "small": _checkpoint(d, "small", {"name": "mnist1d", "num_samples": 300}, epochs=1, lr=1e-3),
        "digits": _checkpoint(d, "digits", {"name": "digits"}, epochs=1, lr=1e-3),
    }
    assert models["good"].acc > models["bad"].acc + 0.15, (models["good"].acc, models["bad"].acc)
    with contextlib.chdir(d):
        client = MlflowClient(uri)
        exp = client.create_experiment("calib-sweeps", artifact_location=(d / "mlartifacts").as_uri())
    return SimpleNamespace(dir=d, uri=uri, client=client, exp=exp, store=MlflowStore(uri), models=models)


def _move(reg, which: str, version: str, run_id: str, promote: bool = False) -> tuple[str, str]:
    from sweeps.integrations.mlflow.champion_gate import move_alias

    m = reg.models[which]
    with contextlib.chdir(reg.dir):
        return move_alias(
            reg.store,
            MODEL,
            version,
            run_id,
            m.cfg.model_dump(mode="json"),
            m.ckpt / "predictions.npz",
            level=0.95,
            num_bins=15,
            promote=promote,
        )


def _register(reg, which: str, promote: bool = False, gate: bool = True) -> tuple[str, str, str, str]:
    """Log and register one model on a new run, then move the alias through the gate; (version, alias, line, run)."""
    from sweeps.integrations.mlflow.model_export import log_and_register
    from tests.unit.sweeps.test_model_export import _finished_run

    m = reg.models[which]
    with contextlib.chdir(reg.dir):
        run_id = _finished_run(reg.client, reg.exp)
        if not gate:  # a champion registered before the gate existed: no record of its rows
            return log_and_register(run_id, m.ckpt, tuple(m.data.input_shape), MODEL, reg.uri), "champion", "", run_id
        version = log_and_register(run_id, m.ckpt, tuple(m.data.input_shape), MODEL, reg.uri, alias=None)
    alias, line = _move(reg, which, version, run_id, promote)
    return version, alias, line, run_id


def _champion(reg) -> str:
    return str(reg.client.get_model_version_by_alias(MODEL, "champion").version)


@pytest.mark.slow
def test_every_branch_of_the_gate(registry):
    reg = registry
    # 1. no champion yet: the alias moves, nothing to compare
    v1, alias, line, _ = _register(reg, "good")
    assert (alias, line, _champion(reg)) == ("champion", "", v1)
    runs = reg.client.search_runs([reg.exp])
    arts = {a.path for a in reg.client.list_artifacts(runs[0].info.run_id, "gate")}
    assert arts == {"gate/rows.npz", "gate/data.json"}

    # 2. a significantly less accurate pick: @challenger, the champion stays, one line says why
    v2, alias, line, _ = _register(reg, "bad")
    assert alias == "challenger" and _champion(reg) == v1, line
    assert line.startswith(f"Champion gate: version {v1} stays @champion, version {v2} is @challenger: ")
    assert "significantly less accurate" in line and "(--promote moves it)" in line and "\n" not in line
    assert str(reg.client.get_model_version_by_alias(MODEL, "challenger").version) == v2
    assert reg.client.get_model_version(MODEL, v2).tags["calib.gate"] == line

    # 3. --promote: it moves anyway, and says so
    v3, alias, line, _ = _register(reg, "bad", promote=True)
    assert alias == "champion" and _champion(reg) == v3 and "--promote" in line

    # 4. a better pick than the (now bad) champion: it moves, with the figures
    v4, alias, line, run4 = _register(reg, "good")
    assert alias == "champion" and _champion(reg) == v4, line
    assert f"version {v4} replaces version {v3}" in line and "rows held out from both" in line

    # 5. another input shape and class count: nothing comparable, the champion stays
    v5, alias, line, _ = _register(reg, "digits")
    assert alias == "challenger" and _champion(reg) == v4
    assert "differ in input shape or classes" in line

    # 6. too few held-out rows (a 300-sample test split of 60 rows)
    v6, alias, line, _ = _register(reg, "small")
    assert alias == "challenger" and _champion(reg) == v4 and "rows are held out from both" in line, line

    # 7. the champion's own version again (a resumed sweep registers the same run): nothing to decide
    assert _move(reg, "good", v4, run4) == ("champion", "")
    assert _champion(reg) == v4


@pytest.mark.slow
def test_a_champion_without_a_record_of_its_rows_is_kept(registry, tmp_path):
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow.store import MlflowStore

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    with contextlib.chdir(tmp_path):
        client = MlflowClient(uri)
        exp = client.create_experiment("calib-sweeps", artifact_location=(tmp_path / "mlartifacts").as_uri())
    reg = SimpleNamespace(dir=tmp_path, uri=uri, client=client, exp=exp, store=MlflowStore(uri), models=registry.models)
    v1, _, _, _ = _register(reg, "bad", gate=False)
    v2, alias, line, _ = _register(reg, "good")
    assert alias == "challenger" and _champion(reg) == v1
    assert "has no record of its training rows" in line
