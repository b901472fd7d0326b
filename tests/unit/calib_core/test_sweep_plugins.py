"""Extension without editing lists: a model, a dataset and a calibrator registered by a plugin module
from outside the package (this test's tmp dir), named in the sweep config's `plugins`, run a tiny
sweep end to end (the Ray trial processes import the plugin too) and the champion loads in a fresh
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sweep_helpers import launch, store, sweep_runs

PLUGIN = textwrap.dedent('''
    """A plugin, as docs/extending.md writes one."""
    import numpy as np
    import torch
    from torch import nn

    from calib_core.calibrators import Calibrator, register_calibrator
    from calib_core.config import DataConfig
    from calib_core.data import DataSplits, Split, register_dataset
    from calib_core.models import Classifier, register_model


    @register_model("plugin_net")
    class PluginNet(Classifier):
        def __init__(self, num_classes, input_shape, width=16):
            super().__init__(num_classes, input_shape)
            self.body = nn.Sequential(nn.Flatten(1), nn.Linear(int(np.prod(self.input_shape)), width), nn.ReLU())
            self._make_head(width)

        def features(self, x):
            return self.body(x)


    @register_dataset("plugin_blobs")
    def load_blobs(cfg: DataConfig, seed: int) -> DataSplits:
        rng = np.random.default_rng(seed)
        centres = rng.normal(0.0, 2.0, size=(3, 8))
        def split(n):
            y = rng.integers(0, 3, size=n)
            x = centres[y] + rng.normal(0.0, 1.5, size=(n, 8))
            return Split(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))
        return DataSplits(train=split(600), val=split(300), test=split(300), num_classes=3, input_shape=(8,),
                          name="plugin_blobs")


    @register_calibrator("plugin_shift")
    class BiasShift(Calibrator):
        """logits + b: one learned bias per class (identity at init)."""
        name = "plugin_shift"
        input_kind = "logits"

        def __init__(self, num_classes):
            super().__init__(num_classes)
            self.bias = nn.Parameter(torch.zeros(num_classes))

        def forward(self, logits):
            self._check_input(logits)
            return logits + self.bias.to(logits.dtype)
''')

CONFIG = textwrap.dedent("""
    name: plugin-sweep
    plugins: [calib_test_plugin]
    run:
      data: {name: plugin_blobs}
      model: {name: plugin_net, kwargs: {width: 16}}
      train: {epochs: 2, batch_size: 64, lr: 0.01, calibrator: plugin_shift}
    search:
      num_samples: 2
      calibrators: [plugin_shift, temperature]
    selection: {num_resamples: 200}
""")


@pytest.fixture(scope="module")
def plugin_sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plugin")
    (d / "calib_test_plugin.py").write_text(PLUGIN)
    (d / "plugin.yaml").write_text(CONFIG)
    proc = launch(d, "--config", str(d / "plugin.yaml"), "--seed", "1", env={"PYTHONPATH": str(d)})
    (d / "stdout.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return d


@pytest.mark.slow  # a whole sweep: the e2e tier
def test_plugin_model_dataset_and_calibrator_run_a_sweep(plugin_sweep):
    parents, children = sweep_runs(store(plugin_sweep), "plugin-sweep")
    assert parents[0].info.status == "FINISHED" and len(children) == 2
    assert {r.data.params["model.name"] for r in children} == {"plugin_net"}
    assert {r.data.params["data.name"] for r in children} == {"plugin_blobs"}
    assert all(r.info.status == "FINISHED" for r in children)
    out = (plugin_sweep / "stdout.txt").read_text()
    assert "of plugin_net on plugin_blobs" in out and "Registered: models:/" in out


@pytest.mark.slow  # a whole sweep: the e2e tier
def test_champion_of_a_plugin_model_loads_in_a_fresh_process(plugin_sweep):
    """The exported spec names the plugin; loading imports it (it must be importable there)."""
    script = textwrap.dedent(f"""
        import mlflow, numpy as np
        mlflow.set_tracking_uri("sqlite:///{plugin_sweep}/mlflow.db")
        model = mlflow.pyfunc.load_model("models:/calibrated-plugin_blobs@champion")
        probs = model.predict(np.zeros((4, 8), dtype=np.float32))
        assert probs.shape == (4, 3) and np.allclose(probs.sum(1), 1.0, atol=1e-5), probs
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=plugin_sweep,
        env={**__import__("os").environ, "PYTHONPATH": str(plugin_sweep)},
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_unknown_names_list_the_registered_ones_plugins_included(tmp_path):
    (tmp_path / "calib_test_plugin.py").write_text(PLUGIN)
    (tmp_path / "plugin.yaml").write_text(CONFIG)
    proc = launch(
        tmp_path,
        "--config",
        str(tmp_path / "plugin.yaml"),
        "--set",
        "run.model.name=plugin_nett",
        "--dry-run",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert "run.model.name: unknown model 'plugin_nett'; registered:" in proc.stderr and "plugin_net," in proc.stderr
    proc = launch(tmp_path, "--config", str(tmp_path / "plugin.yaml"), "--dry-run")  # not on PYTHONPATH
    assert proc.returncode == 2 and "plugins: cannot import 'calib_test_plugin'" in proc.stderr, proc.stderr


def test_declared_builtins_are_what_their_modules_register():
    """calib_core.registry declares the built-ins by "module:attribute": importing the families registers exactly
    those objects (no name a module registers is missing from the declarations), and each declared target is
    the object its module registered."""
    import calib_core.calibrators
    import calib_core.data
    import calib_core.models  # noqa: F401  (the families register on import)
    from calib_core.registry import REGISTRIES

    for kind, reg in REGISTRIES.items():
        assert reg.names(builtin=False) == [], (kind, reg.names(builtin=False))
        for name, obj in reg.items():
            assert obj.__module__.startswith("calib_core."), (kind, name, obj)
