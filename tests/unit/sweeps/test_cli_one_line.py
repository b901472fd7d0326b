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
    assert "…" in line


def test_short_line_is_whole():
    text = "run.model.weights: /w.pth is not a torchvision/resnet18 state dict; save it with torch.save"
    assert _one_line(ValueError(text)) == text


def test_every_problem_keeps_its_field_and_its_advice():
    problems = [
        "search.storage: 'sqlite:////tmp/optuna.db' is a local SQLite file",
        "with --cluster use a database every node can reach (postgresql://...) " + "x" * 200,
        "tracking.uri: 'sqlite:////tmp/x.db' is a local store",
        "with --cluster use an MLflow server URL (http://...) reachable from every node",
    ]
    line = _one_line(ValueError("; ".join(problems)))
    assert len("error: " + line) <= ERROR_LINE_CHARS
    parts = line.split("; ")
    assert parts[0] == problems[0] and parts[2] == problems[2]  # the short parts whole
    assert parts[1].startswith("with --cluster use a database") and parts[1].endswith("xxx") and "…" in parts[1]
