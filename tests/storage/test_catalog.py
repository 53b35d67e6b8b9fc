"""Prices and SLOs in the metadata DB (SQLite and PostgreSQL, after the real migrations): the
seeded GPU prices are there, edits stick, bad values are refused before the database sees them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from storage.catalog import (
    SloTarget,
    add_annotation,
    annotations_in,
    delete_annotation,
    delete_gpu_price,
    delete_slo,
    gpu_prices,
    set_gpu_price,
    set_slo,
    slo_targets,
)
from tests.conftest import migrated_sessions


@pytest.fixture
def sessions(metadata_url: str):
    yield from migrated_sessions(metadata_url)


def test_seeded_prices_and_edits(sessions) -> None:
    seeded = gpu_prices(sessions)
    assert set(seeded) == {"H100", "A100-80GB", "L4", "cpu-demo"}
    assert all(price > 0 for price in seeded.values())
    assert seeded["H100"] > seeded["A100-80GB"] > seeded["L4"] > seeded["cpu-demo"]
    set_gpu_price(sessions, "H100", 2.25, note="reserved, 1 year")
    set_gpu_price(sessions, "B200", 5.0)
    prices = gpu_prices(sessions)
    assert (prices["H100"], prices["B200"], len(prices)) == (2.25, 5.0, 5)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="usd_per_gpu_hour must be >= 0"):
            set_gpu_price(sessions, "L4", bad)
    assert gpu_prices(sessions)["L4"] == seeded["L4"]


def test_slo_targets_upsert_list_delete(sessions) -> None:
    set_slo(sessions, SloTarget("m", "ttft", 2.0, objective=0.99))
    set_slo(sessions, SloTarget("m", "tpot", 0.05, objective=0.95, percentile=0.9))
    set_slo(sessions, SloTarget("m", "ttft", 1.5, objective=0.995))  # replaces the first
    targets = slo_targets(sessions, model="m")
    assert [(t.metric, t.threshold_seconds, t.objective) for t in targets] == [
        ("tpot", 0.05, 0.95),
        ("ttft", 1.5, 0.995),
    ]
    assert targets[0].label == "m tpot p90 <= 0.05s"
    assert delete_slo(sessions, "m", "tpot") and not delete_slo(sessions, "m", "tpot")
    assert len(slo_targets(sessions)) == 1
    for bad, message in (
        (SloTarget("m", "latency", 1.0), "metric must be one of"),
        (SloTarget("m", "ttft", 0.0), "threshold_seconds must be > 0"),
        (SloTarget("m", "ttft", 1.0, objective=1.0), "objective must be within"),
    ):
        with pytest.raises(ValueError, match=message):
            set_slo(sessions, bad)


def test_annotations_in_a_window_and_in_utc(sessions) -> None:
    berlin = timezone(timedelta(hours=1))
    deploy = add_annotation(sessions, datetime(2026, 11, 29, 11, 0, tzinfo=berlin), "deploy 0.32.1", text="pool large")
    add_annotation(
        sessions,
        datetime(2026, 11, 29, 6, 0, tzinfo=UTC),
        "incident",
        ends_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    )
    add_annotation(sessions, datetime(2026, 11, 28, 9, 0, tzinfo=UTC), "yesterday's note")
    marks = annotations_in(
        sessions, datetime(2026, 11, 29, 9, 0, tzinfo=UTC), datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
    )
    # the incident started before the window and lasts into it; the deploy is at 10:00 UTC
    assert [(m.title, m.starts_at) for m in marks] == [
        ("incident", datetime(2026, 11, 29, 6, 0, tzinfo=UTC)),
        ("deploy 0.32.1", datetime(2026, 11, 29, 10, 0, tzinfo=UTC)),
    ]
    with pytest.raises(ValueError, match="timezone"):
        add_annotation(sessions, datetime(2026, 11, 29, 10, 0), "naive")  # noqa: DTZ001
    with pytest.raises(ValueError, match="ends_at"):
        add_annotation(
            sessions, datetime(2026, 11, 29, 10, 0, tzinfo=UTC), "x", ends_at=datetime(2026, 11, 29, 9, tzinfo=UTC)
        )
    assert delete_annotation(sessions, deploy) and not delete_annotation(sessions, deploy)


def test_a_price_can_be_removed(sessions) -> None:
    set_gpu_price(sessions, "B200", 6.5)
    assert delete_gpu_price(sessions, "B200") and "B200" not in gpu_prices(sessions)
    assert not delete_gpu_price(sessions, "B200")
