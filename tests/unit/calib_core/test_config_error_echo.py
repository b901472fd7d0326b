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


@pytest.mark.parametrize("field,wrap", [("train", lambda u: [u]), ("train.lr", lambda u: u)])
def test_a_secret_in_a_long_value_is_masked_before_the_value_is_shortened(field, wrap):
    """Shortening first cut the URI before its '@', and the password's first characters were printed."""
    password = "Z" * 70
    section, _, key = field.partition(".")
    given = wrap(f"postgresql://user:{password}@db.example/optuna")
    line = _line({section: {key: given}} if key else {section: given})
    assert "ZZZ" not in line and "postgresql://user:***@" in line, line


def test_an_override_without_a_key_is_echoed_without_its_secret():
    from calib_core.config import ConfigError, parse_override

    with pytest.raises(ConfigError) as err:
        parse_override("=postgresql://user:" + "Z" * 70 + "@db.example/optuna")
    assert "ZZZ" not in str(err.value) and "empty key" in str(err.value), str(err.value)
