"""calib_core.registry: one registry type with metadata; the name lists in the code and the docs derive from it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from calib_core.registry import CALIBRATORS, DATASETS, MODELS, Registry
from tests.paths import ROOT


def test_builtin_names_and_metadata_are_known_without_importing_torch():
    code = (
        "import sys; from calib_core.registry import DATASETS, MODELS, CALIBRATORS; "
        "from sweeps.config import DEFAULT_CALIBRATORS; from sweeps.checks.preflight import ROOT_DATASETS; "
        "print(len(MODELS), DATASETS.meta('mnist1d')['shape'], DEFAULT_CALIBRATORS, ROOT_DATASETS, "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip().endswith("False"), out  # torch was not imported
    assert "((40,), 10)" in out


def test_metadata_drives_the_lists_the_code_uses():
    from sweeps.checks.preflight import ROOT_DATASETS
    from sweeps.config import DEFAULT_CALIBRATORS

    assert set(ROOT_DATASETS) == {"cifar10", "cifar100", "svhn", "mnist", "fashionmnist", "celeba"}
    assert DEFAULT_CALIBRATORS == ("temperature", "vector", "matrix", "dirichlet", "mlp", "last_layer")
    assert set(DATASETS.names(generated=True)) == {"mnist1d", "mnist1d_mtl"}


def test_declared_shapes_are_the_shapes_the_loaders_produce():
    """The embedded sets' declared (input shape, classes) against what loading them gives."""
    from calib_core.config import DataConfig
    from calib_core.data import load_dataset

    for name in ("mnist1d", "digits", "digits_mtl", "mnist1d_mtl"):
        shape, classes = DATASETS.meta(name)["shape"]
        cfg = DataConfig(name=name, num_samples=300) if DATASETS.meta(name)["generated"] else DataConfig(name=name)
        data = load_dataset(cfg, 0)
        assert (tuple(data.input_shape), data.num_classes) == (shape, classes), name


def test_a_registry_refuses_taken_names_unknown_metadata_and_names_the_allowed_ones():
    reg: Registry[object] = Registry("widget", size=1)
    reg.declare("json_dumps", "json:dumps")
    import json

    assert reg.add("json_dumps", json.dumps) is json.dumps  # the declared object itself: accepted
    with pytest.raises(ValueError, match="already registered to json:dumps"):
        reg.add("json_dumps", json.loads)
    with pytest.raises(ValueError, match=r"unknown metadata \['colour'\]; allowed: size"):
        reg.add("x", object(), colour="red")
    with pytest.raises(ValueError, match="unknown widget 'nope'; allowed: json_dumps"):
        reg.get("nope")
    reg.declare("loads", "json:loads", size=3)
    assert reg.get("loads") is json.loads and reg.names(size=3) == ["loads"]


def _doc_names(text: str) -> set[str]:
    names = set()
    for token in re.split(r"[,;\s]+", text):
        m = re.fullmatch(r"([a-z]+)(\d+)((?:/\d+)*)", token)
        if m and m.group(3):  # resnet18/34/50
            names |= {m.group(1) + n for n in [m.group(2), *m.group(3).strip("/").split("/")]}
        elif token:
            names.add(token)
    return names


@pytest.mark.parametrize("doc", ["docs/layout.md", "docs/design.md"])
def test_name_lists_in_the_docs_are_the_registered_builtins(doc):
    text = (ROOT / doc).read_text()
    models = re.search(r"\((mlp, cnn1d[^)]*)\)|registry: (mlp, cnn1d[^\n]*)", text)
    assert models, doc
    assert _doc_names(models.group(1) or models.group(2)) == set(MODELS.names(builtin=True))
    cal = re.search(r"temperature,\s+vector,\s+matrix,\s+dirichlet,\s+mlp,\s+last_layer", text)
    assert cal, doc
    assert _doc_names(cal.group(0)) == set(CALIBRATORS.names(builtin=True))
