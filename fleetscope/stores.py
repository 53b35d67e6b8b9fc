"""Wiring from settings to stores: ``Settings`` -> ClickHouse client, metadata URL, migrations.

In:  validated ``Settings``.
Out: an open ClickHouse client, and ``migrate_all`` which applies both stores' migrations
     and reports each applied step through a callback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client

from fleetscope.settings import Settings
from migrations import clickhouse_runner, metadata_runner
from storage import retention
from storage.clickhouse import connect, parse_url

__all__ = ["MigrationReport", "migrate_all", "migration_status", "open_clickhouse"]


def open_clickhouse(settings: Settings, *, database: str | None = None) -> Client:
    ch = settings.clickhouse
    target = parse_url(ch.url)
    return connect(
        ch.url,
        database=database,
        # A server database named in the URL is created by `migrate`; chDB uses `default`.
        create_database=bool(database) or (target.kind == "server" and bool(target.database)),
        connect_timeout_s=ch.connect_timeout_s,
        query_timeout_s=ch.query_timeout_s,
    )


@dataclass
class MigrationReport:
    clickhouse: list[str] = field(default_factory=list)
    metadata: list[str] = field(default_factory=list)


def migrate_all(
    settings: Settings,
    *,
    clickhouse: bool = True,
    metadata: bool = True,
    progress: Callable[[str], None] = lambda _line: None,
) -> MigrationReport:
    """Apply pending migrations to both stores (ClickHouse first)."""
    report = MigrationReport()
    if clickhouse:
        client = open_clickhouse(settings)
        try:
            progress(f"ClickHouse: {parse_url(settings.clickhouse.url).describe()}")

            def done(m: clickhouse_runner.Migration) -> None:
                report.clickhouse.append(m.filename)
                progress(f"  applied {m.filename}")

            clickhouse_runner.apply(client, settings.clickhouse.cluster, on_applied=done)
            for table in retention.apply(client, settings.clickhouse.retention.days(), settings.clickhouse.cluster):
                report.clickhouse.append(f"retention of {table}")
                progress(f"  set the retention of {table}")
        finally:
            client.close()
    if metadata:
        progress(f"metadata DB: {_safe_url(settings.metadata.url)}")
        for rev in metadata_runner.upgrade(settings.metadata.url):
            line = f"{rev.revision} {rev.description.splitlines()[0] if rev.description else ''}".strip()
            report.metadata.append(line)
            progress(f"  applied {line}")
    return report


def migration_status(settings: Settings) -> tuple[list[str], list[str]]:
    """Pending ClickHouse files and pending metadata revisions, without applying anything."""
    client = open_clickhouse(settings)
    try:
        ch = [m.filename for m in clickhouse_runner.pending(client, settings.clickhouse.cluster)]
    finally:
        client.close()
    md = [r.revision for r in metadata_runner.pending(settings.metadata.url)]
    return ch, md


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
