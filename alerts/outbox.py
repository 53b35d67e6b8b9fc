"""Outbox: notifications waiting for delivery, stored in the metadata DB (``alert_outbox``).

In:  a sessionmaker on the metadata DB; ``(key, receiver, body)`` from ``alerts.payloads``;
     delivery outcomes from ``alerts.delivery``.
Out: ``enqueue`` -> whether a new row landed; ``due`` -> the pending rows to send now, oldest
     first; ``pending_in`` -> how many rows of one stream still wait (``prune_finished`` drops the
     finished ones a newer row makes moot); ``log`` -> the newest rows
     for the dashboard's notification log; ``counts`` -> rows per status. Rows come back as
     frozen ``OutboxRow`` dataclasses, never ORM objects.

A row is ``pending`` until it is ``delivered`` or ``failed`` (both final). Each call runs in
its own short transaction. ``key`` is unique: enqueueing a key that exists changes nothing and
returns False, also when two processes race: ``INSERT ... ON CONFLICT (key) DO NOTHING`` (as in
``storage.leases``) lets exactly one insert land, on SQLite and PostgreSQL alike, without an
error for the other.
The ``mark_*`` calls change a row only while it is still pending. Times are timezone-aware
UTC in and out (SQLite stores them without a zone: every bound time is converted to UTC first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from common.timeutil import as_utc, aware_utc
from storage.metadata import AlertOutbox

__all__ = [
    "STATUSES",
    "OutboxRow",
    "counts",
    "due",
    "enqueue",
    "log",
    "mark_delivered",
    "mark_failed",
    "mark_retry",
    "pending_in",
    "prune_finished",
]

STATUSES = ("pending", "delivered", "failed")
_MAX_ERROR = 2000  # characters of last_error kept
_REDACTED = "<redacted>"
_INSERTS: dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}

Sessions = sessionmaker[Session]


@dataclass(frozen=True)
class OutboxRow:
    """One notification and where its delivery stands (times in UTC)."""

    id: int
    key: str
    receiver: str
    body: dict[str, Any]
    status: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_status: int | None  # the receiver's last HTTP status (None: no answer)
    last_error: str | None


def enqueue(sessions: Sessions, key: str, receiver: str, body: dict[str, Any], now: datetime) -> bool:
    """Add a pending row due at ``now``; False (and nothing changes) when ``key`` exists."""
    with sessions() as session:
        added = add(session, key, receiver, body, now)
        session.commit()
    return added


def add(session: Any, key: str, receiver: str, body: dict[str, Any], now: datetime) -> bool:
    """``enqueue`` inside the caller's transaction (``alerts.notify`` writes the rows and what the
    group was told in one); False when ``key`` exists."""
    if not 0 < len(key) <= 128:
        raise ValueError(f"outbox key must be 1..128 characters, got {len(key)}")
    now = aware_utc(now, "outbox times")
    insert = _INSERTS.get(session.get_bind().dialect.name)
    if insert is None:
        raise ValueError(f"the outbox needs SQLite or PostgreSQL, not {session.get_bind().dialect.name}")
    t = cast(Table, AlertOutbox.__table__)  # a declarative model's table (typed as any FromClause)
    added = session.execute(
        insert(t)
        .values(
            key=key, receiver=receiver, body=body, status="pending", attempts=0, created_at=now, next_attempt_at=now
        )
        .on_conflict_do_nothing(index_elements=[t.c.key])
        .returning(t.c.id)
    ).first()
    return added is not None


def stream(key: str) -> str:
    """The ordered stream a key belongs to: one alert group at one receiver (the key's first part,
    ``alerts.payloads`` builds keys as ``<group hash>-<sequence>[-...]``)."""
    return key.split("-", 1)[0]


def pending_by_stream(sessions: Sessions) -> dict[str, list[tuple[int, datetime]]]:
    """Pending rows (id, next attempt) per stream, oldest first: a row is sent only when it is its
    stream's first, so a group's resolve never overtakes its trigger while that is retried."""
    t = AlertOutbox
    out: dict[str, list[tuple[int, datetime]]] = {}
    with sessions() as session:
        query = select(t.id, t.key, t.next_attempt_at).where(t.status == "pending").order_by(t.id)
        for row_id, key, next_at in session.execute(query):
            out.setdefault(stream(key), []).append((row_id, as_utc(next_at)))
    return out


def pending_in(sessions: Sessions, stream_id: str) -> int:
    """How many rows of one stream (``stream``) are still pending."""
    t = AlertOutbox
    query = select(func.count()).where(t.status == "pending", t.key.startswith(f"{stream_id}-", autoescape=True))
    with sessions() as session:
        return int(session.scalar(query) or 0)


def prune_finished(session: Any, stream_id: str, suffix: str) -> int:
    """Delete, in the caller's transaction, the delivered or failed rows of one stream whose key ends
    with ``suffix``: rows that a newer one makes moot (an Alertmanager re-send carries everything the
    one before it did). Returns how many went."""
    t = AlertOutbox
    result = session.execute(
        delete(t).where(
            t.status != "pending",
            t.key.startswith(f"{stream_id}-", autoescape=True),
            t.key.endswith(suffix, autoescape=True),
        )
    )
    return int(cast(CursorResult[Any], result).rowcount or 0)


def due(sessions: Sessions, now: datetime, limit: int = 100) -> list[OutboxRow]:
    """Pending rows whose ``next_attempt_at`` has come, oldest first."""
    t = AlertOutbox
    query = (
        select(t)
        .where(t.status == "pending", t.next_attempt_at <= aware_utc(now, "outbox times"))
        .order_by(t.created_at, t.id)
        .limit(limit)
    )
    with sessions() as session:
        return [_row(r) for r in session.scalars(query)]


def mark_delivered(sessions: Sessions, key: str, now: datetime, status: int) -> bool:
    """The receiver accepted it (one more attempt); False when the row was no longer pending."""
    return _update(
        sessions,
        key,
        attempted=True,
        status="delivered",
        delivered_at=aware_utc(now, "outbox times"),
        last_status=status,
        last_error=None,
    )


def mark_retry(
    sessions: Sessions, key: str, next_attempt_at: datetime, status: int | None, error: str, *, attempted: bool = True
) -> bool:
    """Try again at ``next_attempt_at``, keeping why this attempt failed.

    ``attempted=False`` defers a row that was not sent (its receiver is backing off)."""
    return _update(
        sessions,
        key,
        attempted=attempted,
        next_attempt_at=aware_utc(next_attempt_at, "outbox times"),
        last_status=status,
        last_error=error[:_MAX_ERROR],
    )


def mark_failed(sessions: Sessions, key: str, status: int | None, error: str, *, attempted: bool = True) -> bool:
    """Give up on it for good. ``attempted=False`` when no request was made this time."""
    return _update(
        sessions, key, attempted=attempted, status="failed", last_status=status, last_error=error[:_MAX_ERROR]
    )


def log(sessions: Sessions, limit: int = 200, receiver: str | None = None) -> list[OutboxRow]:
    """The newest rows first (any status), for the notification log; secrets in bodies are redacted."""
    t = AlertOutbox
    query = select(t).order_by(t.created_at.desc(), t.id.desc()).limit(limit)
    if receiver is not None:
        query = query.where(t.receiver == receiver)
    with sessions() as session:
        return [_row(r, redact=True) for r in session.scalars(query)]


def counts(sessions: Sessions) -> dict[str, int]:
    """Rows per status, every status present (0 when none)."""
    t = AlertOutbox
    with sessions() as session:
        found = {status: n for status, n in session.execute(select(t.status, func.count()).group_by(t.status))}
    return {s: int(found.get(s, 0)) for s in STATUSES}


# --------------------------------------------------------------------------- helpers


def _update(sessions: Sessions, key: str, *, attempted: bool, **values: Any) -> bool:
    t = AlertOutbox
    if attempted:
        values["attempts"] = t.attempts + 1
    with sessions() as session:
        result = session.execute(update(t).where(t.key == key, t.status == "pending").values(**values))
        changed = cast(CursorResult[Any], result).rowcount  # an UPDATE's result is a cursor's
        session.commit()
    return changed == 1


def _row(r: AlertOutbox, *, redact: bool = False) -> OutboxRow:
    body = dict(r.body)
    if redact and "routing_key" in body:  # a PagerDuty integration key pages people: not for display
        body["routing_key"] = _REDACTED
    return OutboxRow(
        id=r.id,
        key=r.key,
        receiver=r.receiver,
        body=body,
        status=r.status,
        attempts=r.attempts,
        created_at=r.created_at,
        next_attempt_at=r.next_attempt_at,
        delivered_at=r.delivered_at,
        last_status=r.last_status,
        last_error=r.last_error,
    )
