"""common.durations: durations as people write them, and the errors that say how to write one."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from common.durations import Duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("3d", 259200.0),
        ("1w", 604800.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        (" 2m ", 120.0),
        ("0", 0.0),
        (42, 42.0),
        (0.5, 0.5),
    ],
)
def test_a_duration_reads_as_seconds(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 minutes", "m5", "", "-5m", "1h 30m"])
def test_a_bad_duration_says_how_to_write_one(bad: str) -> None:
    with pytest.raises(ValueError, match=r"not a duration: .* \(write e\.g\. 30s, 5m, 1h30m, 3d\)"):
        parse_duration(bad)


def test_a_negative_number_or_a_boolean_is_not_a_duration() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        parse_duration(-1)
    with pytest.raises(ValueError, match="cannot be negative"):
        parse_duration(float("nan"))
    with pytest.raises(ValueError, match="not a duration: True"):
        parse_duration(True)


def test_a_duration_field_holds_seconds_and_names_the_key_it_refuses() -> None:
    class Rule(BaseModel):
        for_: Duration = 0.0

    assert Rule(for_="2m").for_ == 120.0 and Rule(for_=30).for_ == 30.0
    with pytest.raises(ValidationError, match=r"for_\n.*not a duration: 'soon'"):
        Rule(for_="soon")
