"""UTC, the only zone fleetscope computes in.

In:  datetimes from two kinds of places.
Out: - ``as_utc``: a time read back from a store or a result (SQLite, ClickHouse DateTime64,
       pandas): naive means UTC there, since every time is written in UTC;
     - ``aware_utc``: a time a caller hands in (a bound of a lease, an outbox row's due time):
       it must carry its zone, a naive one is refused (``ValueError``) rather than guessed;
       ``None`` is now;
     - ``utc_now``: now, in UTC.
The metadata models store times through ``storage.metadata.UtcDateTime``, which applies both.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["as_utc", "aware_utc", "utc_now"]


def utc_now() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive one is taken to be UTC already."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def aware_utc(value: datetime | None, what: str = "times") -> datetime:
    """``value`` (``None``: now) in UTC; ``ValueError`` for a naive one: ``what`` names them."""
    if value is None:
        return utc_now()
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC)
