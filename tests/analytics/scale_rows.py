"""Hand-written autoscaler decisions for the explain and page tests: a scale-out and the steps of
the replica it started, made with the autoscaler's own event type (``fleet.autoscale.events``) and
written to the store's ``scale_events`` table as the collector writes them."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet.autoscale.events import ScaleEvent, from_decision
from fleet.autoscale.policy import Decision


def scale_out(
    client: object,
    pool: str,
    decided: datetime,
    replica: str,
    *,
    sizes: tuple[int, int] = (1, 2),
    signal: tuple[str, float, float] = ("kv_cache_usage", 0.86, 0.8),
    crossed_s: float = 15.0,
    ready_s: float | None = 40.0,
    serving_s: float | None = 42.0,
) -> ScaleEvent:
    """A scale-out of ``pool`` decided at ``decided`` (its signal crossed ``crossed_s`` before), its
    ``replica`` ready and first serving ``ready_s`` / ``serving_s`` after (None: not yet)."""
    t = decided.timestamp()
    name, value, threshold = signal
    decision = Decision(
        pool, "scale_out", *sizes, name, value, threshold, t - crossed_s, f"{name} {value} > {threshold}"
    )
    event = from_decision(decision, t, source="sim")
    rows = [event]
    if ready_s is not None:
        rows.append(event.step("ready", t + ready_s, replica))
    if serving_s is not None:
        rows.append(event.step("serving", t + serving_s, replica))
    write(client, rows)
    return event


def write(client: object, events: list[ScaleEvent]) -> None:
    def when(seconds: float | None) -> datetime | None:
        return None if seconds is None else datetime.fromtimestamp(seconds, UTC)

    rows = [{**e.row(), "ts": when(e.ts), "crossed_at": when(e.crossed_at)} for e in events]
    columns = list(rows[0])
    client.insert("scale_events", [[r[c] for c in columns] for r in rows], column_names=columns)  # type: ignore[attr-defined]
