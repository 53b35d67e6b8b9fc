"""Retention: days per tier (from ``clickhouse.retention``) -> table TTLs in ClickHouse, and
``Retention``, the same days as the query planner reads them.

In:  a client, the days each tier keeps (``Days``; 0 keeps forever) and the cluster name.
Out: ``ALTER TABLE ... MODIFY TTL`` (or ``REMOVE TTL``) on every table whose TTL differs;
     ``apply`` returns the tables it changed. ``fleetscope migrate`` runs it after the schema
     migrations, so changing the config and migrating again is how retention changes.

Every table is partitioned by day (hour rollups: by month) and has ``ttl_only_drop_parts = 1``
(set by the migrations): expired data leaves by dropping whole parts, never by rewriting them.
The ``series`` table has no TTL: rollups kept for years still need the labels of their series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from clickhouse_connect.driver.client import Client

__all__ = ["TABLES", "Days", "Retention", "apply", "current", "statements"]


@dataclass(frozen=True)
class Days:
    raw: float = 7  # samples and scrapes
    requests: float = 30  # the raw request log
    minute: float = 90  # samples_1m, requests_1m
    hour: float = 730  # samples_1h, requests_1h, samples_6h


@dataclass(frozen=True)
class Retention:
    """What the query planner (``analytics.tiers``) needs to know of retention: the days each tier
    keeps (0: forever) and the longest window each tier serves. Defaults match
    ``clickhouse.retention``."""

    raw_days: float = 7
    requests_days: float = 30
    minute_days: float = 90
    hour_days: float = 730
    raw_max_span: timedelta = timedelta(hours=6)
    minute_max_span: timedelta = timedelta(days=7)
    hour_max_span: timedelta = timedelta(days=15)

    def keeps(self, days: float, start: datetime, now: datetime) -> bool:
        return days <= 0 or start >= now - timedelta(days=days)


# table -> (Days field, TTL time expression)
TABLES: dict[str, tuple[str, str]] = {
    "samples": ("raw", "toDateTime(ts)"),
    "scrapes": ("raw", "toDateTime(ts)"),
    "requests": ("requests", "toDateTime(ts)"),
    "samples_1m": ("minute", "ts"),
    "requests_1m": ("minute", "ts"),
    "samples_1h": ("hour", "ts"),
    "requests_1h": ("hour", "ts"),
    "samples_6h": ("hour", "ts"),
}
_TTL = re.compile(r"\bTTL\s+(.+?)\s+SETTINGS\b", re.DOTALL)


def _ttl(expr: str, days: float) -> str:
    seconds = round(days * 86400)
    if seconds % 86400 == 0:
        return f"{expr} + toIntervalDay({seconds // 86400})"
    return f"{expr} + toIntervalSecond({seconds})"


def current(client: Client, cluster: str | None = None) -> dict[str, str | None]:
    """The TTL expression of each retention-managed table (None: no TTL)."""
    names = {f"{t}_local" if cluster else t: t for t in TABLES}
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase() AND name IN "
        "{names:Array(String)}",
        parameters={"names": list(names)},
    ).result_rows
    out: dict[str, str | None] = {}
    for name, query in rows:
        match = _TTL.search(query)
        out[names[name]] = match.group(1).strip() if match else None
    return out


def statements(days: Days, cluster: str | None = None, have: dict[str, str | None] | None = None) -> list[str]:
    """The ALTERs that bring every table to ``days`` (all of them when ``have`` is None)."""
    on_cluster = f" ON CLUSTER '{cluster}'" if cluster else ""
    out = []
    for table, (field, expr) in TABLES.items():
        physical = f"{table}_local" if cluster else table
        keep = getattr(days, field)
        if keep < 0:
            raise ValueError(f"retention {field} must be >= 0 days (0 keeps forever), got {keep}")
        existing = have.get(table) if have is not None else "?"
        if keep == 0:
            if existing is not None:
                out.append(f"ALTER TABLE {physical}{on_cluster} REMOVE TTL")
            continue
        wanted = _ttl(expr, keep)
        if have is None or _normal(existing) != _normal(wanted):
            out.append(f"ALTER TABLE {physical}{on_cluster} MODIFY TTL {wanted}")
    return out


def _normal(expr: str | None) -> str:
    return re.sub(r"\s+", "", expr or "")


def apply(client: Client, days: Days, cluster: str | None = None) -> list[str]:
    """Set the TTLs that differ; return the tables changed."""
    changed = []
    for statement in statements(days, cluster, current(client, cluster)):
        client.command(statement)
        changed.append(statement.split()[2])
    return changed
