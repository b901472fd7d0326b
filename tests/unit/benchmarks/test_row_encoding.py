"""The bin-exact one-byte storage of the studies' row confidences and the rows files' layouts
(benchmarks/studies/row_encoding.py, issue #31): every row keeps the 15-bin calib_core's binning gives it, every bin
keeps its confidence sum, uint16 arrays still read, and a recode in place changes nothing else."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.studies import row_encoding as re_
from benchmarks.studies.row_encoding import (
    CONF_BINS,
    CONF_SCALE,
    SUBBINS,
    decode_conf,
    encode_conf,
    encode_task,
    library_bins,
    read_rows,
    recode_file,
    task_conf,
    write_rows,
)

EDGES = 4369 * np.arange(CONF_BINS + 1)  # u / 65535 = k / 15 exactly


def test_every_uint16_value_keeps_its_bin_and_its_centre_is_within_half_a_sub_bin():
    u = np.arange(CONF_SCALE + 1, dtype=np.uint16)
    v = u / CONF_SCALE
    bins = library_bins(v)
    assert bins[EDGES].tolist() == list(range(CONF_BINS + 1))  # each edge opens its bin; 1.0 has its own
    assert bins[EDGES[1:] - 1].tolist() == list(range(CONF_BINS))
    for m in (1, 2, SUBBINS, 8, 17):
        q, _ = encode_conf(u, m)
        assert q.dtype == np.uint8 and int(q.max()) == CONF_BINS * m
        centre = decode_conf(q, m=m)
        assert library_bins(centre).tolist() == bins.tolist()
        assert np.abs(centre - v).max() <= 0.5 / (CONF_BINS * m) + 1e-12


tasks = st.lists(
    st.one_of(st.integers(0, CONF_SCALE), st.sampled_from(EDGES.tolist()), st.sampled_from((EDGES[1:] - 1).tolist())),
    min_size=1,
    max_size=300,
).map(lambda xs: np.array(xs, dtype=np.uint16))


@settings(max_examples=200, deadline=None)
@given(tasks, st.sampled_from([2, 3, 10]))
def test_a_task_keeps_every_bin_and_every_bin_sum(u, k):
    enc = encode_task(u, k)
    v = u / CONF_SCALE
    c = decode_conf(enc["conf"], enc.get("binsum"))
    assert library_bins(c).tolist() == library_bins(v).tolist()
    b = library_bins(v)
    np.testing.assert_allclose(np.bincount(b, c, CONF_BINS + 1), np.bincount(b, v, CONF_BINS + 1), rtol=0, atol=1e-9)
    assert np.abs(c - v).max() <= 1 / (CONF_BINS * SUBBINS) + 1e-12  # centre + bin offset: one sub-bin at most
    if enc["conf"].dtype == np.uint8:
        first = c >= (1 - c) / (k - 1)
        assert first.tolist() == (v >= (1 - v) / (k - 1)).tolist()  # the rebuilt top label does not move


def test_a_task_whose_decoded_row_would_fall_below_one_over_k_stays_uint16():
    # K = 7: 1/7 = 0.1429 is inside a sub-bin of bin 2 [0.1333, 0.2); the bin's offset pulls the first row below it
    u = (np.array([0.1430, 0.1834]) * CONF_SCALE).round().astype(np.uint16)
    assert decode_conf(encode_conf(u)[0], encode_conf(u)[1])[0] < 1 / 7 <= u[0] / CONF_SCALE
    enc = encode_task(u, 7)
    assert enc["conf"].dtype == np.uint16 and "binsum" not in enc
    assert encode_task(u, 10)["conf"].dtype == np.uint8


def test_uint16_reads_as_before_and_other_dtypes_are_refused():
    u = np.array([0, 4369, 65535], dtype=np.uint16)
    assert decode_conf(u).tolist() == [0.0, 4369 / 65535, 1.0]
    assert task_conf({"t0_conf": u}, "t0_").tolist() == [0.0, 4369 / 65535, 1.0]
    with pytest.raises(TypeError):
        decode_conf(np.array([0.5]))


def _rows(rng: np.random.Generator, runs: int = 3) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for r in range(runs):
        key = f"reg/eval/m/seed{r + 1}"
        tasks = 2 if r == 0 else 1
        for t in range(tasks):
            n_all = int(rng.integers(1, 50))
            keep = rng.random(n_all) < 0.8
            keep[0] = True
            conf = rng.uniform(0.1, 1.0, int(keep.sum()))
            out[f"{key}/t{t}_conf"] = re_.quantize_conf(conf)
            out[f"{key}/t{t}_correct"] = np.packbits(rng.random(int(keep.sum())) < conf)
            out[f"{key}/t{t}_keep"] = np.packbits(keep)
            out[f"{key}/t{t}_n"] = np.array([n_all, int(keep.sum()), 10], dtype=np.int64)
        out[f"{key}/multitask"] = np.array(int(tasks > 1))
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("packed", [False, True])
def test_both_layouts_read_back_the_same_arrays(tmp_path, packed):
    rows = _rows(np.random.default_rng(0))
    re_.recode_arrays(rows)
    rows["reg/eval/m/seed3/t0_conf"] = re_.quantize_conf(np.array([0.5] * int(rows["reg/eval/m/seed3/t0_n"][1])))
    del rows["reg/eval/m/seed3/t0_binsum"]  # one task left uint16: both widths in one file
    path = tmp_path / "rows.npz"
    write_rows(path, rows, packed=packed)
    assert re_.is_packed(path) == packed
    _same(dict(read_rows(path)), rows)
    if packed:  # a writer that knows only members appends to a packed file: its arrays read too, last one wins
        with np.load(path) as z:
            more = {k: z[k] for k in z.files}
        more["reg/eval/m/seed9/multitask"] = np.array(0)
        more["reg/eval/m/seed1/multitask"] = np.array(0)
        np.savez_compressed(path, **more)
        got = dict(read_rows(path))
        assert got["reg/eval/m/seed9/multitask"] == 0 and got["reg/eval/m/seed1/multitask"] == 0
        assert list(got)[-1] == "reg/eval/m/seed9/multitask"


@pytest.mark.parametrize("pack", [None, True])
def test_recode_in_place_changes_only_the_confidences(tmp_path, pack):
    rows = _rows(np.random.default_rng(1))
    path = tmp_path / "rows.npz"
    np.savez_compressed(path, **rows)
    assert re_.main([str(path)] + (["--pack"] if pack else [])) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["rows.npz"]  # no temporary file left
    assert re_.is_packed(path) == bool(pack)
    got = read_rows(path)
    for k, a in rows.items():
        if k.endswith("conf"):
            p = k[: -len("conf")]
            assert got[k].dtype == np.uint8 and got[f"{p}binsum"].shape == (CONF_BINS + 1,)
            assert library_bins(task_conf(got, p)).tolist() == library_bins(a / CONF_SCALE).tolist()
        else:
            assert np.array_equal(got[k], a) and got[k].dtype == a.dtype
    again = recode_file(path)  # already recoded: nothing to do, the file is left as it is
    assert again["recoded"] == 0 and again["bytes_after"] == again["bytes_before"]
