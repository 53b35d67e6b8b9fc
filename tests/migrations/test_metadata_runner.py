"""Metadata DB migrations on SQLite and PostgreSQL: upgrade, downgrade to base, upgrade again."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from migrations import metadata_runner
from storage.metadata import Base, make_engine

EXPECTED = {
    "gpu_prices",
    "replicas",
    "slos",
    "annotations",
    "leases",
    "alert_states",
    "alert_groups",
    "alert_outbox",
    "silences",
    "alert_evaluations",
    "saved_queries",
}
REVISIONS = ["0001", "0002", "0003", "0004", "0005"]


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(metadata_url: str) -> None:
    applied = metadata_runner.upgrade(metadata_url)
    assert [r.revision for r in applied] == REVISIONS
    assert table_names(metadata_url) >= EXPECTED
    assert metadata_runner.upgrade(metadata_url) == []  # second run changes nothing
    metadata_runner.downgrade(metadata_url, "base")
    assert table_names(metadata_url) == set()
    assert metadata_runner.current(metadata_url) is None
    assert [r.revision for r in metadata_runner.upgrade(metadata_url)] == REVISIONS
    assert table_names(metadata_url) >= EXPECTED


def test_migrations_match_the_models(metadata_url: str) -> None:
    """The alembic history builds exactly the schema the ORM models describe."""
    metadata_runner.upgrade(metadata_url)
    engine = make_engine(metadata_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []
