"""Scale events: a decision and what became of it -> one row of the store's ``scale_events`` table.

In:  a ``policy.Decision`` (``scale_out``, ``scale_in``, ``held_at_max``, ``flap_guard``) or a
     replica's step after one (``ready``: healthy and in the gateway's pool; ``serving``: its first
     token; ``draining``; ``removed``; ``start_failed``), with the time it happened.
Out: ``ScaleEvent`` and ``ScaleEvent.row()``: a JSON-able dict with the table's columns
     (migrations/clickhouse/0013_scale_events.sql), which the live autoscaler posts to the
     collector's ``POST /v1/events`` and the simulator writes as it plays.

A decision's ``decision_id`` ties the replica's later steps to it, so the cold start (decision ->
ready -> serving) and the scale-out lag (signal crossing -> serving) are read back by id.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.autoscale.policy import Decision

__all__ = ["DECISION_KINDS", "KINDS", "REPLICA_KINDS", "ScaleEvent", "from_decision"]

DECISION_KINDS = ("scale_out", "scale_in", "held_at_max", "flap_guard")
REPLICA_KINDS = ("ready", "serving", "draining", "removed", "start_failed")
KINDS = DECISION_KINDS + REPLICA_KINDS


@dataclass(frozen=True)
class ScaleEvent:
    ts: float  # seconds since the epoch
    pool: str  # the model the pool serves
    kind: str  # one of KINDS
    decision_id: str
    replica: str = ""  # the replica started or stopped ("" for a hold)
    from_replicas: int = 0
    to_replicas: int = 0
    signal: str = ""
    value: float = 0.0
    threshold: float = 0.0
    crossed_at: float | None = None  # when the signal first crossed its threshold
    source: str = "autoscaler"  # autoscaler (live) or sim (virtual time)
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scale event kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("extra")
        return row

    def step(self, kind: str, ts: float, replica: str = "", detail: str = "") -> ScaleEvent:
        """A later step of this decision (same pool, id, sizes and signal)."""
        return ScaleEvent(
            ts, self.pool, kind, self.decision_id, replica or self.replica, self.from_replicas, self.to_replicas,
            self.signal, self.value, self.threshold, self.crossed_at, self.source, detail,
        )  # fmt: skip


def from_decision(decision: Decision, ts: float, *, replica: str = "", source: str = "autoscaler") -> ScaleEvent:
    return ScaleEvent(
        ts, decision.pool, decision.kind, uuid.uuid4().hex[:16], replica, decision.from_replicas,
        decision.to_replicas, decision.signal, decision.value, decision.threshold, decision.crossed_at, source,
        decision.reason,
    )  # fmt: skip
