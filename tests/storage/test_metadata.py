"""Metadata models on SQLite and PostgreSQL after the real migrations."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from migrations import metadata_runner
from storage.metadata import Annotation, GpuPrice, Replica, Slo, make_engine, make_sessionmaker


@pytest.fixture
def session_factory(metadata_url: str):
    metadata_runner.upgrade(metadata_url)
    engine = make_engine(metadata_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_rows_round_trip(session_factory) -> None:
    with session_factory.begin() as s:
        s.add(GpuPrice(gpu_type="B200", usd_per_gpu_hour=2.49))
        s.add(
            Replica(name="small-0", model="tiny-small", gpu_type="H100", gpu_count=1, endpoint="http://127.0.0.1:8001")
        )
        s.add(
            Slo(
                model="tiny-small",
                metric="ttft",
                threshold_seconds=0.5,
                percentile=0.99,
                objective=0.99,
                window_days=30,
            )
        )
        s.add(Annotation(starts_at=datetime(2026, 11, 29, 9, tzinfo=UTC), title="deploy v2", tags={"kind": "deploy"}))
    with session_factory() as s:
        replica = s.scalars(select(Replica)).one()
        assert (replica.name, replica.gpu_count, replica.created_at is not None) == ("small-0", 1, True)
        assert s.scalars(select(GpuPrice.usd_per_gpu_hour).where(GpuPrice.gpu_type == "B200")).one() == pytest.approx(
            2.49
        )
        assert s.scalars(select(Annotation)).one().tags == {"kind": "deploy"}


def test_constraints_refuse_bad_rows(session_factory) -> None:
    bad_rows = [
        GpuPrice(gpu_type="T4", usd_per_gpu_hour=-1.0),
        Slo(model="m", metric="latency", threshold_seconds=1.0, objective=0.99, window_days=30),
        Slo(model="m", metric="ttft", threshold_seconds=1.0, objective=1.5, window_days=30),
    ]
    for row in bad_rows:
        with pytest.raises(IntegrityError), session_factory.begin() as s:
            s.add(row)
    with session_factory.begin() as s:
        s.add(GpuPrice(gpu_type="T4", usd_per_gpu_hour=0.35))
    with pytest.raises(IntegrityError), session_factory.begin() as s:
        s.add(GpuPrice(gpu_type="T4", usd_per_gpu_hour=0.4))
