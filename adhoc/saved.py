"""Saved queries: ad-hoc SQL kept by name in the metadata DB (table ``saved_queries``).

In:  metadata sessions; a name, the SQL text, an optional description and author.
Out: ``saved_queries`` (by name), ``save_query`` (adds, or replaces the one of that name; the
     text must pass the statement check, so nothing kept can write), ``delete_query``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from adhoc.guard import check
from storage.metadata import SavedQuery

__all__ = ["EXAMPLE_QUERY", "Saved", "delete_query", "save_query", "saved_queries"]

# what the SQL page's editor opens with: it has a time column, so the page draws its chart; the last
# day only (the whole history is 720 hours a model: cut at the row limit, it would show the oldest);
# sampled rows count by their weight, and each source (gateway, engine spans) on its own line
EXAMPLE_QUERY = (
    "SELECT toStartOfHour(ts) AS hour, model, source, round(sum(weight)) AS requests\n"
    "FROM requests\nWHERE ts >= now() - INTERVAL 1 DAY\nGROUP BY hour, model, source\nORDER BY hour, model, source"
)


@dataclass(frozen=True)
class Saved:
    name: str
    sql: str
    description: str
    created_by: str
    updated_at: datetime


def saved_queries(sessions: Any) -> list[Saved]:
    with sessions() as s:
        rows = list(s.scalars(select(SavedQuery).order_by(SavedQuery.name)))
    return [Saved(r.name, r.sql, r.description or "", r.created_by or "", r.updated_at) for r in rows]


def save_query(sessions: Any, name: str, sql: str, description: str = "", created_by: str = "") -> bool:
    """Keep ``sql`` as ``name``; True when it replaced a query of that name. ``ValueError`` (or
    ``adhoc.guard.Refused``) says what is wrong."""
    name = name.strip()
    if not name:
        raise ValueError("give the query a name")
    if len(name) > 200:
        raise ValueError("a query name is at most 200 characters")
    check(sql)
    with sessions.begin() as s:
        row = s.scalars(select(SavedQuery).where(SavedQuery.name == name)).first()
        if row is None:
            s.add(
                SavedQuery(
                    name=name,
                    sql=sql.strip(),
                    description=description.strip() or None,
                    created_by=created_by.strip() or None,
                )
            )
            return False
        row.sql, row.description = sql.strip(), description.strip() or None
        row.created_by = created_by.strip() or row.created_by
        return True


def delete_query(sessions: Any, name: str) -> bool:
    with sessions.begin() as s:
        deleted: int = s.execute(delete(SavedQuery).where(SavedQuery.name == name)).rowcount
        return deleted > 0
