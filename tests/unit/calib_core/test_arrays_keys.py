"""Which arrays of an `.npz` (or .npy folder) the `arrays` dataset reads (calib_core/data/arrays.py): numpy's,
scikit-learn's and the common names without configuration, `data.x_key` / `data.y_key` otherwise, and one line
naming the arrays and the setting when the file holds none or two of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.data.files import DataError

SEED = 2
RNG = np.random.default_rng(4)
X = RNG.normal(1.0, 3.0, (60, 4))
Y = np.arange(60) % 3


def _same_as_reference(tmp_path, data) -> None:
    """The splits equal those of the same arrays saved as numpy's own `x` and `y`."""
    np.savez(tmp_path / "reference.npz", x=X, y=Y)
    ref = load_dataset(DataConfig(name="arrays", path=str(tmp_path / "reference.npz")), SEED)
    for s in ("train", "val", "test"):
        assert torch.equal(getattr(data, s).x, getattr(ref, s).x) and torch.equal(getattr(data, s).y, getattr(ref, s).y)


@pytest.mark.parametrize("keys", [("X", "y"), ("x", "y"), ("data", "target"), ("features", "labels")])
def test_the_usual_names_are_found_without_configuration(tmp_path, keys):
    np.savez(tmp_path / "a.npz", **{keys[0]: X, keys[1]: Y})
    _same_as_reference(tmp_path, load_dataset(DataConfig(name="arrays", path=str(tmp_path / "a.npz")), SEED))


def test_a_folder_of_npy_files_takes_the_same_names(tmp_path):
    (tmp_path / "pair").mkdir()
    np.save(tmp_path / "pair" / "X.npy", X)
    np.save(tmp_path / "pair" / "target.npy", Y)
    _same_as_reference(tmp_path, load_dataset(DataConfig(name="arrays", path=str(tmp_path / "pair")), SEED))


def test_configured_keys_pick_the_arrays(tmp_path):
    np.savez(tmp_path / "a.npz", emb=X, cls=Y, other=np.zeros(3))
    cfg = DataConfig(name="arrays", path=str(tmp_path / "a.npz"), x_key="emb", y_key="cls")
    _same_as_reference(tmp_path, load_dataset(cfg, SEED))


def test_a_configured_key_settles_an_ambiguous_file(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((60, 2)), X=X, y=Y)
    _same_as_reference(tmp_path, load_dataset(DataConfig(name="arrays", path=str(tmp_path / "a.npz"), x_key="X"), 2))


def _refusal(path, **keys) -> str:
    with pytest.raises(DataError) as err:
        load_dataset(DataConfig(name="arrays", path=str(path), **keys), SEED)
    return str(err.value)


def test_two_candidate_arrays_are_refused_naming_them_and_the_setting(tmp_path):
    np.savez(tmp_path / "a.npz", x=X, X=X, y=Y)
    path = tmp_path / "a.npz"
    assert _refusal(path) == f"arrays: {path} has several features arrays (x, X); set data.x_key to one of them"
    np.savez(tmp_path / "b.npz", X=X, y=Y, labels=Y)
    path = tmp_path / "b.npz"
    assert _refusal(path) == f"arrays: {path} has several labels arrays (y, labels); set data.y_key to one of them"


def test_a_file_without_the_usual_names_is_refused_naming_its_arrays_and_the_setting(tmp_path):
    np.savez(tmp_path / "a.npz", emb=X, cls=Y)
    path = tmp_path / "a.npz"
    assert _refusal(path) == (
        f"arrays: {path} has no features array named x, X, data, features (its arrays: cls, emb); set data.x_key to "
        "the one that holds them"
    )
    assert _refusal(path, x_key="emb") == (
        f"arrays: {path} has no labels array named y, target, labels (its arrays: cls, emb); set data.y_key to the "
        "one that holds them"
    )


def test_a_configured_key_the_file_lacks_is_refused_naming_the_arrays_it_has(tmp_path):
    np.savez(tmp_path / "a.npz", X=X, y=Y)
    path = tmp_path / "a.npz"
    assert _refusal(path, x_key="x") == f"arrays: {path} has no array 'x' (data.x_key); its arrays: X, y"
    assert _refusal(path, y_key="Y") == f"arrays: {path} has no array 'Y' (data.y_key); its arrays: X, y"


def test_shape_problems_name_the_array_read(tmp_path):
    np.savez(tmp_path / "a.npz", X=X, y=Y[:50])
    path = tmp_path / "a.npz"
    assert _refusal(path) == f"arrays: y in {path} has shape (50,); it needs (60,), one label per row of X (60, 4)"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"x_key": "a", "y_key": "a"}, "data.x_key and data.y_key name the same array 'a'; the labels need their own"),
        ({"x_key": "X.npy"}, "must be an array name as saved by numpy.savez (like X or y), got 'X.npy'"),
        ({"name": "table", "label_column": "y", "x_key": "X"}, "data.x_key applies to arrays only, not 'table'"),
    ],
)
def test_the_key_settings_are_checked_with_the_config(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DataConfig(**{"name": "arrays", "path": "a.npz", **fields})
