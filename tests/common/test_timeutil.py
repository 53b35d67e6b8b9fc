"""common.timeutil: every time fleetscope computes with is UTC; a naive one handed in is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from common.timeutil import as_utc, aware_utc, utc_now


def test_a_time_read_back_naive_is_taken_as_utc_and_an_aware_one_converted() -> None:
    naive = datetime(2026, 11, 29, 12, 0)  # noqa: DTZ001 - as SQLite hands it back
    assert as_utc(naive) == datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    paris = datetime(2026, 11, 29, 13, 0, tzinfo=timezone(timedelta(hours=1)))
    got = as_utc(paris)
    assert got == datetime(2026, 11, 29, 12, 0, tzinfo=UTC) and got.utcoffset() == timedelta(0)


def test_a_naive_time_handed_in_is_refused_naming_what_it_is() -> None:
    with pytest.raises(ValueError, match=r"^lease bounds must be timezone-aware, got naive 2026-11-29T12:00:00$"):
        aware_utc(datetime(2026, 11, 29, 12, 0), "lease bounds")  # noqa: DTZ001 - the mistake refused
    tokyo = datetime(2026, 11, 29, 21, 0, tzinfo=timezone(timedelta(hours=9)))
    assert aware_utc(tokyo) == datetime(2026, 11, 29, 12, 0, tzinfo=UTC) and aware_utc(tokyo).tzinfo is UTC


def test_no_time_is_now_in_utc() -> None:
    before = datetime.now(UTC)
    got, now = aware_utc(None), utc_now()
    assert got.tzinfo is UTC and now.tzinfo is UTC and before <= got <= now <= datetime.now(UTC)
