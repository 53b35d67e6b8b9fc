"""Alerts -> notifications in the outbox: silences, inhibition, routes, grouping and timing.

In:  every current alert (firing, and resolved ones still kept) after an evaluation, the
     ``alerts`` settings (receivers, routes, inhibit rules) and the metadata sessions
     (silences, ``alert_groups``, ``alert_outbox``).
Out: ``Notification`` rows enqueued in the outbox (``alerts.outbox``) with idempotency keys;
     ``alerts.delivery`` sends them. Returns what was enqueued.

Alertmanager's rules: a silenced or inhibited alert is not notified. Alerts are grouped per
route by its ``group_by`` labels; a new group waits ``group_wait`` before its first
notification (so alerts firing together arrive together); a changed group (an alert added or
resolved) is notified again at most every ``group_interval``; an unchanged firing group is
repeated every ``repeat_interval``. What a group was last sent (its digest and sequence) is in
``alert_groups``, so a restart does not page again; a group whose alerts all resolved (and
were told so) closes, and its sequence goes on counting when it opens again. The outbox row is
written before the group row: a crash in between re-enqueues the same key, which the outbox
ignores.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from alerts import outbox
from alerts.config import AlertsSettings, Route
from alerts.model import Alert
from alerts.payloads import Notification, bodies
from alerts.store import silences
from storage.metadata import AlertGroup

__all__ = ["Notifier", "Sent", "group_key"]

log = logging.getLogger(__name__)


def group_key(route_index: int, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"route{route_index}:{{{inner}}}"


def _digest(alerts: list[Alert]) -> str:
    text = ";".join(sorted(f"{a.fingerprint}:{a.status}" for a in alerts))
    return hashlib.sha256(text.encode()).hexdigest()


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@dataclass(frozen=True)
class Sent:
    receiver: str
    group_key: str
    sequence: int
    alerts: int
    keys: list[str]


@dataclass
class _Bucket:
    route: Route
    labels: dict[str, str]
    alerts: list[Alert]


class Notifier:
    def __init__(self, sessions: Any, settings: AlertsSettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.receivers = {r.name: r for r in settings.receivers}

    def muted(self, alerts: list[Alert], at: datetime) -> tuple[list[Alert], dict[str, str]]:
        """The alerts left to notify, and why each other one is muted (fingerprint -> reason)."""
        active = silences(self.sessions, active_at=at)
        firing = [a.labels for a in alerts if a.status == "firing"]
        keep, why = [], {}
        for a in alerts:
            silence = next((s for s in active if s.mutes(a.labels, at)), None)
            if silence is not None:
                why[a.fingerprint] = f"silenced by #{silence.id} ({silence.created_by}: {silence.comment})"
                continue
            if a.status == "firing" and any(r.mutes(a.labels, firing) for r in self.settings.inhibit_rules):
                why[a.fingerprint] = "inhibited"
                continue
            keep.append(a)
        return keep, why

    def dispatch(self, alerts: list[Alert], at: datetime) -> list[Sent]:
        """Enqueue what is due at ``at`` for ``alerts`` (all current firing and resolved alerts)."""
        if not self.receivers:
            return []
        alerts, _ = self.muted(alerts, at)
        buckets: dict[tuple[str, str], _Bucket] = {}
        indices = {id(r): i for i, r in enumerate([*self.settings.routes])}
        for a in alerts:
            for route in self.settings.routes_for(a.labels):
                labels = route.group_labels(a.labels)
                key = group_key(indices.get(id(route), len(self.settings.routes)), labels)
                buckets.setdefault((route.receiver, key), _Bucket(route, labels, [])).alerts.append(a)
        sent: list[Sent] = []
        with self.sessions() as s:
            rows = {(g.receiver, g.group_key): g for g in s.scalars(select(AlertGroup))}
        for (receiver, key), bucket in sorted(buckets.items()):
            row = rows.pop((receiver, key), None)
            done = self._one(receiver, key, bucket, row, at)
            if done is not None:
                sent.append(done)
        stale = [g.id for g in rows.values() if g.first_seen_at is not None]  # no alert left: resolved or muted
        if stale:
            with self.sessions.begin() as s:
                s.execute(update(AlertGroup).where(AlertGroup.id.in_(stale))
                          .values(first_seen_at=None, sent_at=None, digest=None))
        return sent

    def _one(self, receiver: str, key: str, b: _Bucket, row: AlertGroup | None, at: datetime) -> Sent | None:
        firing = any(a.status == "firing" for a in b.alerts)
        digest = _digest(b.alerts)
        if row is None or row.first_seen_at is None:
            if not firing:
                return None  # resolved before it was ever notified
            with self.sessions.begin() as s:  # a group opens (again): group_wait counts from now
                if row is None:
                    s.add(AlertGroup(receiver=receiver, group_key=key, first_seen_at=at, sent_at=None, digest=None,
                                     sequence=0))
                else:
                    s.execute(update(AlertGroup).where(AlertGroup.id == row.id).values(first_seen_at=at))
            first_seen, sent_at, last_digest, sequence = at, None, None, row.sequence if row is not None else 0
        else:
            first_seen, sent_at, last_digest, sequence = _utc(row.first_seen_at), _utc(row.sent_at), row.digest, row.sequence
        r = b.route
        if sent_at is None:
            due = firing and at - first_seen >= timedelta(seconds=r.group_wait_s)
        elif digest != last_digest:
            due = at - sent_at >= timedelta(seconds=r.group_interval_s)
        else:
            due = firing and at - sent_at >= timedelta(seconds=r.repeat_interval_s)
        if not due:
            return None
        sequence += 1
        alerts = sorted(b.alerts, key=lambda a: (a.status != "firing", a.starts_at, a.fingerprint))
        n = Notification(receiver=receiver, group_key=key, group_labels=b.labels, alerts=alerts,
                         external_url=self.settings.external_url, sequence=sequence)
        rows = bodies(self.receivers[receiver], n)
        for k, body in rows:  # first the outbox (idempotent by key), then what the group was told
            outbox.enqueue(self.sessions, k, receiver, body, at)
        with self.sessions.begin() as s:
            values = ({"sent_at": at, "digest": digest, "sequence": sequence} if firing else
                      {"first_seen_at": None, "sent_at": None, "digest": None, "sequence": sequence})
            s.execute(update(AlertGroup).where(AlertGroup.receiver == receiver, AlertGroup.group_key == key).values(**values))
        log.info("notify %s %s #%d: %d alert(s), %d outbox row(s)", receiver, key, sequence, len(alerts), len(rows))
        return Sent(receiver, key, sequence, len(alerts), [k for k, _ in rows])
