"""Leases: named active/standby locks in the metadata DB, atomic across processes and hosts.

In:  a bind — an ``Engine`` (each call runs in its own short transaction, committed before it
     returns) or a ``Connection`` / ``Session`` (the call joins the caller's transaction and the
     caller commits) — a lease name, a holder id and a TTL.
Out: ``acquire`` -> whether the holder now holds the lease; ``release`` -> whether it held it;
     ``holder_of`` -> who holds it now (or None); ``read`` -> the row as a ``LeaseState``.

Semantics. A lease is held from its acquisition until ``expires_at`` (exclusive), which each
renewal moves to ``now + ttl``. ``acquire`` succeeds when the lease is free (no row), expired,
or already held by the same holder (a renewal: ``acquired_at`` is kept). A holder renews about
every ``ttl / 3`` and stops its work as soon as ``acquire`` returns False (or cannot reach the
database before its lease runs out). Times are timezone-aware UTC; ``now`` defaults to this
process' clock, so the clocks of the contenders must agree to well within the TTL (NTP).

Atomicity, on SQLite and PostgreSQL alike: one conditional ``UPDATE ... WHERE name = :n AND
(holder = :h OR expires_at <= :now)`` takes or renews an existing row — the database evaluates
the condition under the row's write lock, so of two contenders only one sees it true — and
``INSERT ... ON CONFLICT DO NOTHING RETURNING name`` creates a missing row, so of two
concurrent inserts only one lands (the loser gets no row back instead of an IntegrityError).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Engine, Table, and_, case, delete, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from common.timeutil import aware_utc
from storage.metadata import Lease

__all__ = ["LeaseState", "acquire", "holder_id", "holder_of", "read", "release"]

Bind = Engine | Connection | Session

_leases = cast("Table", Lease.__table__)  # the table (not an alias): update, insert and delete take it
# each dialect's own INSERT, which has ON CONFLICT DO NOTHING
_INSERTS: dict[str, Callable[[Table], Any]] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
_MAX_NAME = 128
_MAX_HOLDER = 256


@dataclass(frozen=True)
class LeaseState:
    """One lease row, times in UTC. ``expires_at`` may be in the past (then it is free)."""

    name: str
    holder: str
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime

    def held_at(self, now: datetime) -> bool:
        return aware_utc(now, "lease times") < self.expires_at


def holder_id() -> str:
    """A holder id unique to this process run: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def acquire(bind: Bind, name: str, holder: str, ttl_s: float, now: datetime | None = None) -> bool:
    """Take or renew lease ``name`` for ``holder`` until ``now + ttl_s``; True when it holds it."""
    _check(name, holder)
    if not ttl_s > 0:
        raise ValueError(f"lease {name!r}: ttl_s must be > 0, got {ttl_s!r}")
    now = aware_utc(now, "lease times")
    expires = now + timedelta(seconds=ttl_s)
    t = _leases
    still_ours = and_(t.c.holder == holder, t.c.expires_at > now)
    take = (
        update(t)
        .where(t.c.name == name, or_(t.c.holder == holder, t.c.expires_at <= now))
        .values(
            holder=holder,
            # a renewal keeps the start of the holding; a takeover (or a lapsed lease) starts anew
            acquired_at=case((still_ours, t.c.acquired_at), else_=literal(now, t.c.acquired_at.type)),
            renewed_at=now,
            expires_at=expires,
        )
    )
    with _transaction(bind) as conn:
        if cast("CursorResult[Any]", conn.execute(take)).rowcount == 1:
            return True
        insert = _INSERTS.get(_dialect(conn))
        if insert is None:
            raise ValueError(f"leases need SQLite or PostgreSQL, not {_dialect(conn)}")
        create = (
            insert(t)
            .values(name=name, holder=holder, acquired_at=now, renewed_at=now, expires_at=expires)
            .on_conflict_do_nothing(index_elements=[t.c.name])
            .returning(t.c.name)
        )
        # No row back: the row exists and is someone else's, or a concurrent insert got there first.
        return conn.execute(create).first() is not None


def release(bind: Bind, name: str, holder: str) -> bool:
    """Give the lease up (a standby may take it at once); True when ``holder`` had it."""
    _check(name, holder)
    t = _leases
    with _transaction(bind) as conn:
        done = cast("CursorResult[Any]", conn.execute(delete(t).where(t.c.name == name, t.c.holder == holder)))
        return bool(done.rowcount == 1)


def holder_of(bind: Bind, name: str, now: datetime | None = None) -> str | None:
    """Who holds ``name`` at ``now`` (None when nobody does or the lease has expired)."""
    now = aware_utc(now, "lease times")
    t = _leases
    with _transaction(bind) as conn:
        return conn.execute(select(t.c.holder).where(t.c.name == name, t.c.expires_at > now)).scalar_one_or_none()


def read(bind: Bind, name: str) -> LeaseState | None:
    """The lease row as stored (expired or not), or None when there is none."""
    t = _leases
    with _transaction(bind) as conn:
        row = conn.execute(select(t).where(t.c.name == name)).one_or_none()
    if row is None:
        return None
    return LeaseState(row.name, row.holder, row.acquired_at, row.renewed_at, row.expires_at)


# --------------------------------------------------------------------------- helpers


@contextmanager
def _transaction(bind: Bind) -> Iterator[Connection | Session]:
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    else:
        yield bind


def _dialect(conn: Connection | Session) -> str:
    return conn.get_bind().dialect.name if isinstance(conn, Session) else conn.dialect.name


def _check(name: str, holder: str) -> None:
    if not 0 < len(name) <= _MAX_NAME:
        raise ValueError(f"lease name must be 1..{_MAX_NAME} characters, got {name!r}")
    if not 0 < len(holder) <= _MAX_HOLDER:
        raise ValueError(f"lease {name!r}: holder must be 1..{_MAX_HOLDER} characters, got {holder!r}")
