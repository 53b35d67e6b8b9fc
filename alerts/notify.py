"""Alerts -> notifications in the outbox: silences, inhibition, routes, grouping and timing.

In:  every current alert (firing, and resolved ones still kept) after an evaluation, the
     ``alerts`` settings (receivers, routes, inhibit rules) and the metadata sessions
     (silences, ``alert_groups``, ``alert_outbox``).
Out: ``Notification`` rows enqueued in the outbox (``alerts.outbox``) with idempotency keys;
     ``alerts.delivery`` sends them. Returns what was enqueued. ``alertmanager`` receivers get
     every alert left after silences and inhibition, pushed as Prometheus does
     (``alerts.alertmanager``): routes and group timings are Alertmanager's there.

Alertmanager's rules: a silenced or inhibited alert is not notified; one whose receiver was told
it fires and that leaves its group for any reason (resolved, silenced, inhibited, its rule
removed, dropped while the evaluator was down) is told as resolved, so no incident stays open. Alerts are grouped per
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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from alerts import outbox
from alerts.alertmanager import Pusher
from alerts.config import AlertsSettings, Route
from alerts.model import Alert, resolved_from, stored
from alerts.payloads import Notification, bodies
from alerts.store import silences
from storage.metadata import AlertGroup

__all__ = ["Notifier", "Sent", "group_key"]

log = logging.getLogger(__name__)


def group_key(route_index: int, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    key = f"route{route_index}:{{{inner}}}"
    if len(key) > 500:  # alert_groups.group_key holds 512: long label sets keep a readable head and a hash
        key = f"{key[:460]}…{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    return key


def _digest(alerts: list[Alert]) -> str:
    text = ";".join(sorted(f"{a.fingerprint}:{a.status}" for a in alerts))
    return hashlib.sha256(text.encode()).hexdigest()


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
    def __init__(self, sessions: Any, settings: AlertsSettings, intervals: Mapping[str, float] | None = None) -> None:
        """``intervals``: each rule's group interval by rule name (how long Alertmanager keeps an alert)."""
        self.sessions = sessions
        self.settings = settings
        self.receivers = {r.name: r for r in settings.receivers}
        self.pusher = Pusher(sessions, settings.receivers, intervals)  # the alertmanager receivers

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

    def _route(self, key: str) -> Route | None:
        """The route a stored group key came from (the default one if its index is gone)."""
        head = key.split(":", 1)[0].removeprefix("route")
        index = int(head) if head.isdigit() else -1
        if 0 <= index < len(self.settings.routes):
            return self.settings.routes[index]
        return self.settings.default_route()

    def dispatch(self, alerts: list[Alert], at: datetime) -> list[Sent]:
        """Enqueue what is due at ``at`` for ``alerts`` (all current firing and resolved alerts)."""
        if not self.receivers:
            return []
        alerts, _ = self.muted(alerts, at)
        pushed = [Sent(p.receiver, p.group_key, p.sequence, p.alerts, p.keys) for p in self.pusher.push(alerts, at)]
        buckets: dict[tuple[str, str], _Bucket] = {}
        indices = {id(r): i for i, r in enumerate([*self.settings.routes])}
        for a in alerts:
            for route in self.settings.routes_for(a.labels):
                labels = route.group_labels(a.labels)
                key = group_key(indices.get(id(route), len(self.settings.routes)), labels)
                buckets.setdefault((route.receiver, key), _Bucket(route, labels, [])).alerts.append(a)
        with self.sessions() as s:
            groups = s.scalars(select(AlertGroup).where(AlertGroup.receiver.not_in(sorted(self.pusher.names))))
            rows = {(g.receiver, g.group_key): g for g in groups}
        for (receiver, key), row in rows.items():
            told = (row.sent or {}).get("firing", []) if row.first_seen_at is not None else []
            if not told:
                continue
            bucket = buckets.get((receiver, key))
            if bucket is None:  # nothing of the group is left: what it was told resolves
                last_route = self._route(key)
                if last_route is None or receiver not in self.receivers:
                    continue
                bucket = buckets[(receiver, key)] = _Bucket(last_route, dict((row.sent or {}).get("labels", {})), [])
            present = {a.fingerprint for a in bucket.alerts}
            bucket.alerts.extend(resolved_from(item, at) for item in told if item["fingerprint"] not in present)
        sent: list[Sent] = pushed
        for (receiver, key), bucket in sorted(buckets.items()):
            row = rows.pop((receiver, key), None)
            try:
                done = self._one(receiver, key, bucket, row, at)
            except Exception:
                log.exception("could not notify %s of group %s", receiver, key)
                continue
            if done is not None:
                sent.append(done)
        stale = [g.id for g in rows.values() if g.first_seen_at is not None]  # no alert left, nothing to resolve
        if stale:
            with self.sessions.begin() as s:
                s.execute(
                    update(AlertGroup)
                    .where(AlertGroup.id.in_(stale))
                    .values(first_seen_at=None, sent_at=None, digest=None, sent=None)
                )
        return sent

    def _one(self, receiver: str, key: str, b: _Bucket, row: AlertGroup | None, at: datetime) -> Sent | None:
        firing = any(a.status == "firing" for a in b.alerts)
        config = self.receivers[receiver]
        # what this receiver would see: without send_resolved a resolve changes nothing for it
        seen = [a for a in b.alerts if config.send_resolved or a.status == "firing"]
        digest: str | None = _digest(seen)
        told = {item["fingerprint"] for item in (row.sent or {}).get("firing", [])} if row is not None else set()
        told_before = bool(row is not None and row.first_seen_at is not None and told)
        if row is not None and not config.send_resolved and told_before and {a.fingerprint for a in seen} <= told:
            digest = row.digest  # only fewer firing: nothing new for a receiver that is not told resolves
        if row is None or row.first_seen_at is None:
            if not firing:
                return None  # resolved before it was ever notified
            with self.sessions.begin() as s:  # a group opens (again): group_wait counts from now
                if row is None:
                    s.add(
                        AlertGroup(
                            receiver=receiver, group_key=key, first_seen_at=at, sent_at=None, digest=None, sequence=0
                        )
                    )
                else:
                    s.execute(update(AlertGroup).where(AlertGroup.id == row.id).values(first_seen_at=at))
            first_seen, sent_at, last_digest, sequence = at, None, None, row.sequence if row is not None else 0
        else:
            first_seen, sent_at, last_digest, sequence = row.first_seen_at, row.sent_at, row.digest, row.sequence
        r = b.route
        if sent_at is None:
            due = firing and at - first_seen >= timedelta(seconds=r.group_wait_s)
        elif digest != last_digest:
            due = at - sent_at >= timedelta(seconds=r.group_interval_s)
        else:
            due = firing and at - sent_at >= timedelta(seconds=r.repeat_interval_s)
        if not due:
            return None
        if not firing and not told_before:
            return None
        sequence += 1
        alerts = sorted(b.alerts, key=lambda a: (a.status != "firing", a.starts_at, a.fingerprint))
        n = Notification(
            receiver=receiver,
            group_key=key,
            group_labels=b.labels,
            alerts=alerts,
            external_url=self.settings.external_url,
            sequence=sequence,
        )
        rows = bodies(config, n)
        if firing:
            values = {
                "sent_at": at,
                "digest": digest,
                "sequence": sequence,
                "sent": {"labels": b.labels, "firing": [stored(a) for a in alerts if a.status == "firing"]},
            }
        else:  # everything in it resolved and was told so: the group closes, its sequence goes on
            values = {"first_seen_at": None, "sent_at": None, "digest": None, "sequence": sequence, "sent": None}
        with self.sessions.begin() as s:  # the rows and what the group was told: both or neither
            added = [outbox.add(s, k, receiver, body, at) for k, body in rows]
            s.execute(
                update(AlertGroup).where(AlertGroup.receiver == receiver, AlertGroup.group_key == key).values(**values)
            )
        if not all(added):
            log.warning("notification %s #%d of group %s was already in the outbox", receiver, sequence, key)
        log.info("notify %s %s #%d: %d alert(s), %d outbox row(s)", receiver, key, sequence, len(alerts), len(rows))
        return Sent(receiver, key, sequence, len(alerts), [k for k, _ in rows])
