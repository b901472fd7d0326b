"""The champion takes inputs as users hold them (issue #44 item 2).

Tiny image-folder models (grey and RGB, trained on 10x12 files resized to 8x8) and a table model are trained for one
epoch, logged and registered (tests/unit/sweeps/test_raw_inputs.py's helpers), loaded with `mlflow.pyfunc.load_model`
and served in-process through MLflow's own scoring app (`mlflow.pyfunc.scoring_server.init`, the app `mlflow models
serve` runs, driven as ASGI). Grey (N, H, W) arrays uint8 and float (0..1 and 0..255), RGB (N, H, W, C) arrays, lists
of PIL images and base64 PNG / JPEG files must give the probabilities of an independent reference: the images
converted and resized with PIL by hand as the record says (mode, size, bilinear), scaled by 1/255 and standardised
with the record's mean/std in numpy, through the trained module. A DataFrame in gives a DataFrame whose columns are
the class names. A wrong input is one line, without the input's values, and HTTP 400 when served.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from tests.unit.sweeps.test_raw_inputs import _register, _test_rows, _train, _trainer_probs

MODEL = "inputs-as-held"
SIZE = (10, 12)  # (H, W) of the files; the models take 8x8


def _write_folder(root, mode: str) -> None:
    rng = np.random.default_rng(1)
    for k, cls in enumerate(["dark", "light"]):
        (root / cls).mkdir(parents=True)
        for i in range(30):
            a = rng.integers(0, 90, (*SIZE, 3)) + 130 * k
            a[..., 1] = 255 - a[..., 1]  # colour that a grey conversion weighs
            Image.fromarray(a.astype(np.uint8)).convert(mode).save(root / cls / f"{i}.png")


def _image_model(tmp_path_factory, mode: str):
    from calib_core.data.image_folder import find_images

    d = tmp_path_factory.mktemp(f"images-{mode}")
    _write_folder(d / "img", mode)
    cfg, data, result = _train(
        {
            "data": {"name": "image_folder", "path": str(d / "img"), "image_size": 8, "image_mode": mode},
            "model": {"name": "cnn2d"},
        }
    )
    model, mv = _register(d, cfg, data, result, f"{MODEL}-{mode}")
    _, samples = find_images(d / "img")
    y = np.asarray([k for _, k in samples])
    files = [samples[i][0] for i in _test_rows(y, cfg)]
    return model, mv, files, _trainer_probs(result, data.test.x)


@pytest.fixture(scope="module")
def grey(tmp_path_factory):
    return _image_model(tmp_path_factory, "L")


@pytest.fixture(scope="module")
def rgb(tmp_path_factory):
    return _image_model(tmp_path_factory, "RGB")


def _reference(model, images: list[Image.Image]) -> np.ndarray:
    """By hand from the record: PIL convert + bilinear resize, numpy scale and standardise, the trained module."""
    py = model.unwrap_python_model()
    record = py.spec["preprocessing"]
    h, w = record["image_size"]
    assert record["resize"] == "PIL bilinear"
    rows = []
    for im in images:
        a = np.asarray(im.convert(record["image_mode"]).resize((w, h), Image.Resampling.BILINEAR), dtype=np.float64)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
        mean = np.asarray(record["mean"])[:, None, None]
        std = np.asarray(record["std"])[:, None, None]
        rows.append((a * record["scale"] - mean) / std)
    x = torch.from_numpy(np.stack(rows).astype(np.float32))
    with torch.no_grad():
        return torch.softmax(py.module(x).double(), dim=-1).numpy()


def _encode(im: Image.Image, fmt: str) -> str:
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def _serve(model, payload: dict, monkeypatch) -> tuple[int, dict]:
    """POST /invocations to the app `mlflow models serve` runs (mlflow.pyfunc.scoring_server.init), in-process."""
    from mlflow.pyfunc import scoring_server

    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "false")  # init sets it; restored after the test
    app = scoring_server.init(model)
    body = json.dumps(payload).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/invocations",
        "raw_path": b"/invocations",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict] = []
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected until the response is sent
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


# ---------------------------------------------------------------------------- arrays and PIL images
def test_grey_arrays_as_pil_and_numpy_give_them(grey):
    model, mv, files, trained = grey
    pil = [Image.open(f) for f in files]
    assert {im.mode for im in pil} == {"L"}
    expected = _reference(model, pil)
    np.testing.assert_allclose(expected, trained, atol=1e-6, rtol=0)  # the reference is what training computed
    u8 = np.stack([np.asarray(im) for im in pil])
    assert u8.shape == (len(files), *SIZE) and u8.dtype == np.uint8  # (N, H, W): how PIL decodes grey files
    forms = {
        "uint8 (N, H, W)": u8,
        "float32 0..1 (N, H, W)": u8.astype(np.float32) / 255,
        "float64 0..255 (N, H, W)": u8.astype(np.float64),
        "uint8 (N, H, W, 1)": u8[..., None],
        "float32 0..1 (N, 1, H, W)": u8[:, None].astype(np.float32) / 255,
        "torch uint8 (N, H, W)": torch.from_numpy(u8),
        "list of PIL images": pil,
        "PIL images as RGB": [im.convert("RGB") for im in pil],
        "list of (H, W) arrays": [np.asarray(im) for im in pil],
    }
    for form, x in forms.items():
        got = model.predict(x)
        assert isinstance(got, np.ndarray), form  # not a DataFrame in: the array, column k = class k
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0, err_msg=form)
    assert "PIL images" in mv.description and "dark, light" in mv.description


def test_colour_arrays_and_images_of_other_sizes_on_a_grey_model(grey):
    model, _, files, _ = grey
    rng = np.random.default_rng(2)
    rgb = rng.integers(0, 256, (3, 14, 9, 3)).astype(np.uint8)  # another size: resized as the loader resizes
    want = _reference(model, [Image.fromarray(a) for a in rgb])
    np.testing.assert_allclose(model.predict(rgb), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(model.predict(rgb.transpose(0, 3, 1, 2).copy()), want, atol=1e-6, rtol=0)
    rgba = np.concatenate([rgb, np.full((3, 14, 9, 1), 255, np.uint8)], axis=-1)
    np.testing.assert_allclose(model.predict(rgba), want, atol=1e-6, rtol=0)
    mixed = [Image.fromarray(rgb[0]), Image.open(files[0])]  # different sizes and modes in one list
    np.testing.assert_allclose(
        model.predict(mixed), _reference(model, [Image.fromarray(rgb[0]), Image.open(files[0])]), atol=1e-6, rtol=0
    )


def test_grey_arrays_on_an_rgb_model(rgb):
    model, _, files, trained = rgb
    pil = [Image.open(f) for f in files]
    assert {im.mode for im in pil} == {"RGB"}
    np.testing.assert_allclose(model.predict(np.stack([np.asarray(im) for im in pil])), trained, atol=1e-6, rtol=0)
    np.testing.assert_allclose(model.predict(pil), trained, atol=1e-6, rtol=0)
    grey_pixels = np.stack([np.asarray(im.convert("L")) for im in pil])  # (N, H, W): channels copied as PIL does
    want = _reference(model, [Image.fromarray(a) for a in grey_pixels])
    np.testing.assert_allclose(model.predict(grey_pixels), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(model.predict(grey_pixels / 255.0), want, atol=1e-6, rtol=0)


def test_a_dataframe_in_gives_the_class_names_out(grey):
    model, mv, files, trained = grey
    sig = model.metadata.signature
    assert [c.name for c in sig.outputs.inputs] == ["dark", "light"]  # the MLflow UI shows which column is which
    assert sig.inputs is None
    assert {p.name for p in sig.params.params} == {"inputs", "layout", "pixels", "output", "alpha", "method"}
    pngs = [_encode(Image.open(f), "PNG") for f in files]
    frame = pd.DataFrame({"image": pngs}, index=[f"file{i}" for i in range(len(files))])
    got = model.predict(frame)
    assert isinstance(got, pd.DataFrame) and list(got.columns) == ["dark", "light"]
    assert list(got.index) == list(frame.index)
    np.testing.assert_allclose(got.to_numpy(), trained, atol=1e-6, rtol=0)
    u8 = np.stack([np.asarray(Image.open(f)) for f in files])
    as_frame = model.predict(u8, params={"output": "frame"})
    assert list(as_frame.columns) == ["dark", "light"]
    np.testing.assert_allclose(as_frame.to_numpy(), trained, atol=1e-6, rtol=0)
    assert isinstance(model.predict(frame, params={"output": "array"}), np.ndarray)


# ---------------------------------------------------------------------------- served: base64 PNG / JPEG
def test_served_base64_png_and_jpeg(grey, monkeypatch):
    model, _, files, trained = grey
    pil = [Image.open(f) for f in files]
    status, body = _serve(model, {"inputs": [_encode(im, "PNG") for im in pil]}, monkeypatch)
    assert status == 200, body
    np.testing.assert_allclose(np.asarray(body["predictions"]), trained, atol=1e-6, rtol=0)

    jpegs = [_encode(im, "JPEG") for im in pil]  # lossy: the reference decodes the very same bytes
    want = _reference(model, [Image.open(io.BytesIO(base64.b64decode(s))) for s in jpegs])
    split = {"columns": ["image"], "data": [[s] for s in jpegs]}
    status, body = _serve(model, {"dataframe_split": split}, monkeypatch)
    assert status == 200, body
    rows = body["predictions"]  # a DataFrame's records: the class names on every row
    assert all(set(r) == {"dark", "light"} for r in rows)
    np.testing.assert_allclose([[r["dark"], r["light"]] for r in rows], want, atol=1e-6, rtol=0)

    uri = "data:image/png;base64," + _encode(pil[0], "PNG")
    status, body = _serve(model, {"inputs": [uri], "params": {"output": "frame"}}, monkeypatch)
    assert status == 200 and list(body["predictions"][0]) == ["dark", "light"], body
    u8 = np.stack([np.asarray(im) for im in pil])
    status, body = _serve(model, {"inputs": (u8 / 255).tolist()}, monkeypatch)  # float 0..1 as JSON lists
    assert status == 200, body
    np.testing.assert_allclose(np.asarray(body["predictions"]), trained, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- wrong inputs: one line
BAD_IMAGES = {
    "no channel axis": (np.full((2, 5, 6, 7), 0.123456, np.float32), "cannot tell the channels"),
    "pixels over 255": (np.full((2, 10, 12), 300.123456), "float pixel values must lie in 0..255"),
    "negative integers": (np.full((2, 10, 12), -7, np.int64), "integer pixel values must lie in 0..255"),
    "text that is not base64": (["not an image 0.123456!"], "that is not base64"),
    "base64 that is not an image": ([base64.b64encode(b"0.123456" * 10).decode()], "PIL cannot decode"),
    "one colour image without a batch axis": (np.zeros((10, 12, 3), np.uint8), "pass a batch of one"),
    "a rank-5 array": (np.full((1, 2, 3, 4, 5), 0.123456), "got an array of shape (1, 2, 3, 4, 5)"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_a_wrong_image_input_is_one_line_and_http_400(grey, case, monkeypatch):
    from mlflow.exceptions import MlflowException

    model, _, _, _ = grey
    x, says = BAD_IMAGES[case]
    with pytest.raises(MlflowException) as e:
        model.predict(x)
    line = e.value.message
    assert says in line and "\n" not in line and "0.1234" not in line and len(line) < 300, line
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"
    payload = {"inputs": x.tolist() if isinstance(x, np.ndarray) else x}
    status, body = _serve(model, payload, monkeypatch)
    assert status == 400 and body["message"] == line, body  # the same line: MLflow's "Failed to predict data" kept out


def test_a_wrong_param_is_one_line(grey):
    from mlflow.exceptions import MlflowException

    model, _, files, _ = grey
    u8 = np.stack([np.asarray(Image.open(f)) for f in files])
    with pytest.raises(MlflowException, match=r"^pixels '0\.\.100' is none of auto, 0\.\.255, 0\.\.1$"):
        model.predict(u8, params={"pixels": "0..100"})
    with pytest.raises(MlflowException, match=r"^params output: 'json' is neither 'frame' nor 'array'$"):
        model.predict(u8, params={"output": "json"})


# ---------------------------------------------------------------------------- tables
@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from sklearn.datasets import load_breast_cancer

    d = tmp_path_factory.mktemp("table")
    frame = load_breast_cancer(as_frame=True).frame.iloc[:, [0, 1, 2, 3, 30]]
    frame["target"] = frame["target"].map({0: "malignant", 1: "benign"})
    frame["site"] = np.where(np.arange(len(frame)) % 3 == 0, "left", "right")
    frame.loc[::17, "mean texture"] = np.nan  # empty cells: trained with missing: impute_mean
    frame.to_csv(d / "patients.csv", index=False)
    cfg, data, result = _train(
        {
            "data": {
                "name": "table",
                "path": str(d / "patients.csv"),
                "label_column": "target",
                "categorical": "onehot",
                "missing": "impute_mean",
            },
            "model": {"name": "mlp"},
        }
    )
    model, mv = _register(d, cfg, data, result, MODEL + "-table")
    raw = pd.read_csv(d / "patients.csv")
    y = np.unique(raw["target"].astype(str).to_numpy(), return_inverse=True)[1]
    rows = raw.iloc[_test_rows(y, cfg)]
    return model, mv, rows, result, data


def test_table_rows_as_users_hold_them(table):
    model, mv, rows, result, data = table
    expected = _trainer_probs(result, data.test.x)
    got = model.predict(rows)
    assert list(got.columns) == ["benign", "malignant"] and list(got.index) == list(rows.index)
    np.testing.assert_allclose(got.to_numpy(), expected, atol=1e-6, rtol=0)
    shuffled = rows[rows.columns[::-1]].assign(patient_id=np.arange(len(rows)), note="x")  # extra columns: ignored
    np.testing.assert_allclose(model.predict(shuffled).to_numpy(), expected, atol=1e-6, rtol=0)
    # a column the model fills may be left out: every cell reads as empty, i.e. the train mean, 0 once standardised
    names = model.unwrap_python_model().spec["preprocessing"]["feature_names"]
    x = data.test.x.clone()
    x[:, list(names).index("mean texture")] = 0.0
    with pytest.warns(UserWarning, match=r"column\(s\) mean texture left out: read as empty in every row"):
        left_out = model.predict(rows.drop(columns=["mean texture"]))
    np.testing.assert_allclose(left_out.to_numpy(), _trainer_probs(result, x), atol=1e-6, rtol=0)
    sig = model.metadata.signature
    assert {c.name for c in sig.inputs.inputs} == {"mean radius", "mean texture", "mean perimeter", "mean area", "site"}
    assert not any(c.required for c in sig.inputs.inputs)  # the model names what is missing, in one line
    assert [c.name for c in sig.outputs.inputs] == ["benign", "malignant"]
    assert "classes benign, malignant in that order" in mv.description


def test_a_table_without_the_models_columns_is_one_line_and_http_400(table, monkeypatch):
    """Every column may be left out of an impute_mean model one by one, never all at once (that would answer the
    train means for any table); a model trained with missing: reject refuses any missing column
    (test_raw_inputs.py)."""
    from mlflow.exceptions import MlflowException

    model, _, rows, _, _ = table
    other = pd.DataFrame({"age": rows["mean area"].to_numpy(), "dose": 0.123456})
    with pytest.raises(MlflowException) as e:
        model.predict(other)
    line = e.value.message
    assert line.startswith("missing column(s) mean radius, mean texture, mean perimeter, mean area, site; the model")
    assert "\n" not in line and "0.1234" not in line and str(rows["mean area"].iloc[0]) not in line
    split = json.loads(other.to_json(orient="split", index=False))
    status, body = _serve(model, {"dataframe_split": split}, monkeypatch)
    assert status == 400 and body["message"] == line, body
    with pytest.raises(MlflowException, match=r"; unknown column\(s\) age, dose \(ignored\);"):
        model.unwrap_python_model().predict(None, other)  # MLflow's predict drops them before the model sees them
    status, body = _serve(
        model, {"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}, monkeypatch
    )
    assert status == 200 and list(body["predictions"][0]) == ["benign", "malignant"], body
