"""A long error line loses its middle, never its field (the start) or its advice (the end): issue #44's refusal whose
hint was cut off mid-word."""

from __future__ import annotations

from sweeps.cli import ERROR_LINE_CHARS, _one_line


def test_long_line_keeps_field_and_advice():
    advice = "; set data.text_columns: drop or onehot (allowed: reject, drop, onehot), or list data.feature_columns"
    listing = ", ".join(f"column_{i}" for i in range(300))
    line = _one_line(ValueError(f"run.data: table: data.csv has free-text columns {listing}{advice}"))
    assert len("error: " + line) == ERROR_LINE_CHARS and "\n" not in line
    assert line.startswith("run.data: table: data.csv has free-text columns column_0, ")
    assert line.endswith(advice)
    assert "characters)… " in line


def test_short_line_is_whole():
    text = "run.model.weights: /w.pth is not a torchvision/resnet18 state dict; save it with torch.save"
    assert _one_line(ValueError(text)) == text
