"""A bad config value is echoed in its error line whatever its type: lists and mappings too, clipped."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calib_core.config import MAX_ECHO, RunConfig, format_validation_error


def _line(raw: dict) -> str:
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate(raw)
    return format_validation_error(err.value)


def test_a_list_where_a_number_belongs_is_echoed():
    assert _line({"train": {"lr": [1, 2]}}) == "train.lr: Input should be a valid number (got [1, 2])"


def test_a_long_list_where_a_section_belongs_is_echoed_clipped_with_its_length():
    given = list(range(100))
    line = _line({"train": given})
    got = line.split("(got ", 1)[1][:-1]
    assert len(got) <= MAX_ECHO and got.startswith("[0, 1, 2") and f"({len(repr(given))} characters)" in got
