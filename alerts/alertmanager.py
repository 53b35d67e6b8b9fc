"""Alerts -> a real Alertmanager's v2 API, pushed the way Prometheus pushes them.

In:  every current alert after an evaluation (firing, and resolved ones still kept), past
     fleetscope's own silences and inhibition (``alerts.notify`` hands them over); the
     ``alertmanager`` receivers (``ReceiverConfig``: base URLs, ``resend_interval``); each rule's
     group interval by rule name; the metadata sessions (``alert_groups`` keeps what each
     Alertmanager was told, ``alert_outbox`` takes the pushes).
Out: ``Pusher.push`` -> one outbox row per Alertmanager URL that is due (``Pushed``); at delivery,
     ``request`` -> the URL to POST (``{base}/api/v2/alerts``) and the JSON array to send,
     ``[{labels, annotations, startsAt, endsAt, generatorURL}, ...]``.

Prometheus' rules (its notifier and alerting rules):
- Every alert goes to every Alertmanager of the receiver, which routes, groups, silences,
  inhibits and notifies: fleetscope's routes and group timings are not used for it. A new firing
  alert or a new resolve is pushed at once; while anything fires, everything firing is pushed
  again every ``resend_interval`` (default 1m).
- A firing alert's ``endsAt`` is now + 4 × max(its group's interval, ``resend_interval``), so
  Alertmanager keeps it active between re-sends and resolves it by itself once they stop
  (fleetscope is down for that long).
- A resolved alert is pushed once more with ``endsAt`` = when it resolved (in the past), and
  Alertmanager tells its receivers ``status: resolved``. An alert an Alertmanager was told is
  firing and that is gone for another reason (silenced or inhibited in fleetscope, its rule
  removed, dropped while the evaluator was down) is pushed as resolved then, as for every receiver.
- ``labels``: ``alertname`` (the rule's name) and the alert's labels (replica, model, severity ...);
  ``annotations``: the rule's rendered annotations (summary, description ...); ``generatorURL``:
  the alert's Investigate link on the dashboard (``alerts.external_url``), left out when there is
  none. Alertmanager refuses a whole push (400) for one name outside ``[A-Za-z_][A-Za-z0-9_]*``,
  so any other character of a name is written ``_``; empty values are left out (Alertmanager
  reads them as absent).

Delivery goes through the outbox like every notification (retries, backoff, at least once; the
pushes to one Alertmanager are one ordered stream, so a resolve never overtakes its trigger). A
push still waiting in the outbox stands for the re-send: no other re-send is queued behind it
while an Alertmanager is down, and ``request`` moves each firing alert's ``endsAt`` on by how
long its push waited, so a push delivered late does not end its alerts in the past. A re-send
(key ``<stream>-<sequence>-resend``) makes the finished re-sends before it moot: they are deleted
when it is queued, so the outbox and the notification log keep every push that changed something
and only the newest re-send (one a minute would otherwise be 1,440 rows a day per Alertmanager).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from alerts import outbox
from alerts.errors import ReceiverError
from alerts.model import Alert, iso, resolved_from, stored
from alerts.receivers import ReceiverConfig
from common.timeutil import as_utc
from storage.metadata import AlertGroup

__all__ = ["API_PATH", "LIFETIME_RESENDS", "RESEND_SUFFIX", "Pushed", "Pusher", "group_key", "postable", "request"]

log = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
LIFETIME_RESENDS = 4  # Prometheus: endsAt = now + 4 × max(evaluation interval, resend delay)
RESEND_SUFFIX = "-resend"  # the key of a push that only re-sends what the one before it said
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class Pushed:
    """One push queued for one Alertmanager."""

    receiver: str
    group_key: str  # alertmanager:<base URL>
    sequence: int  # the pushes to this Alertmanager, counted
    alerts: int
    keys: list[str]


def group_key(url: str) -> str:
    """The ``alert_groups`` row of one Alertmanager of a receiver (its base URL, or a hash of a long one)."""
    key = f"alertmanager:{url}"
    return key if len(key) <= 500 else f"{key[:460]}…{hashlib.sha256(key.encode()).hexdigest()[:32]}"


class Pusher:
    """Queues pushes to the ``alertmanager`` receivers of ``receivers`` (the others are left alone)."""

    def __init__(
        self, sessions: Any, receivers: list[ReceiverConfig], intervals: Mapping[str, float] | None = None
    ) -> None:
        self.sessions = sessions
        self.receivers = [r for r in receivers if r.type == "alertmanager"]
        self.names = {r.name for r in self.receivers}
        self.intervals = dict(intervals or {})  # rule name -> its group's interval (s)

    def push(self, alerts: list[Alert], at: datetime) -> list[Pushed]:
        """Queue what is due at ``at`` for ``alerts`` (every current firing and resolved alert)."""
        if not self.receivers:
            return []
        with self.sessions() as s:
            query = select(AlertGroup).where(AlertGroup.receiver.in_(sorted(self.names)))
            rows = {(g.receiver, g.group_key): g for g in s.scalars(query)}
        out: list[Pushed] = []
        for receiver in self.receivers:
            for url in receiver.targets():
                key = group_key(url)
                try:
                    done = self._one(receiver, url, key, rows.get((receiver.name, key)), alerts, at)
                except Exception:
                    log.exception("could not queue the push to Alertmanager %s (receiver %s)", url, receiver.name)
                    continue
                if done is not None:
                    out.append(done)
        return out

    def _one(
        self, receiver: ReceiverConfig, url: str, key: str, row: AlertGroup | None, alerts: list[Alert], at: datetime
    ) -> Pushed | None:
        told = {i["fingerprint"]: i for i in ((row.sent or {}).get("firing", []) if row is not None else [])}
        firing = [a for a in alerts if a.status == "firing"]
        present = {a.fingerprint for a in alerts}
        resolved = [a for a in alerts if a.status == "resolved" and a.fingerprint in told]
        resolved += [resolved_from(item, at) for fp, item in told.items() if fp not in present]
        stream = _stream(receiver.name, key)
        resend = {a.fingerprint for a in firing} == set(told)
        if resend:  # nothing new: only the periodic re-send
            if not firing:
                return None
            last = row.sent_at if row is not None else None
            if last is not None and at - last < timedelta(seconds=receiver.resend_interval_s):
                return None
            if outbox.pending_in(self.sessions, stream):  # the push still waiting is the re-send
                return None
        sequence = (row.sequence if row is not None else 0) + 1
        items = sorted(firing, key=lambda a: (a.starts_at, a.fingerprint)) + resolved
        body = {"url": url, "alerts": [postable(a, at, self.lifetime_s(receiver, a)) for a in items]}
        opened = row.first_seen_at if row is not None and told else None  # when this episode began
        values: dict[str, Any] = {
            "first_seen_at": (opened or at) if firing else None,
            "sent_at": at,
            "digest": hashlib.sha256(";".join(sorted(a.fingerprint for a in firing)).encode()).hexdigest(),
            "sequence": sequence,
            "sent": {"labels": {}, "firing": [stored(a) for a in firing]} if firing else None,
        }
        k = f"{stream}-{sequence}" + (RESEND_SUFFIX if resend else "")
        with self.sessions.begin() as s:  # the push and what this Alertmanager was told: both or neither
            if resend:  # the re-sends before this one are moot: the log keeps the changes and the last re-send
                outbox.prune_finished(s, stream, RESEND_SUFFIX)
            added = outbox.add(s, k, receiver.name, body, at)
            if row is None:
                s.add(AlertGroup(receiver=receiver.name, group_key=key, **values))
            else:
                s.execute(update(AlertGroup).where(AlertGroup.id == row.id).values(**values))
        if not added:
            log.warning("push %s #%d to Alertmanager %s was already in the outbox", receiver.name, sequence, url)
        log.info("push to Alertmanager %s #%d: %d firing, %d resolved", url, sequence, len(firing), len(resolved))
        return Pushed(receiver.name, key, sequence, len(items), [k])

    def lifetime_s(self, receiver: ReceiverConfig, alert: Alert) -> float:
        """How long Alertmanager keeps ``alert`` active without a re-send."""
        return LIFETIME_RESENDS * max(receiver.resend_interval_s, self.intervals.get(alert.name, 0.0))


def postable(alert: Alert, at: datetime, lifetime_s: float) -> dict[str, Any]:
    """``alert`` as the outbox keeps it for Alertmanager: a v2 postable alert, plus its ``status``
    (which ``request`` takes out before it is sent)."""
    item: dict[str, Any] = {
        "status": alert.status,
        "labels": _names(alert.labels),
        "annotations": _names(alert.annotations),
        "startsAt": iso(alert.starts_at),
        "endsAt": iso(at + timedelta(seconds=lifetime_s) if alert.status == "firing" else alert.ends_at or at),
    }
    if alert.generator_url:
        item["generatorURL"] = alert.generator_url
    return item


def request(
    receiver: ReceiverConfig, body: Mapping[str, Any], created_at: datetime, now: datetime
) -> tuple[str, list[dict[str, Any]]]:
    """The URL and the JSON array to POST for an outbox row of ``receiver`` made at ``created_at``,
    sent at ``now``: firing alerts end as much later as the row waited."""
    url = str(body.get("url", ""))
    if url not in receiver.targets():
        raise ReceiverError(
            f"Alertmanager {url or '(no URL)'} is no longer configured for receiver {receiver.name!r} "
            f"(its URLs: {', '.join(receiver.targets())}): not delivered"
        )
    late = max(timedelta(0), as_utc(now) - as_utc(created_at))
    alerts = []
    for item in body.get("alerts", []):
        posted = {k: v for k, v in item.items() if k != "status"}
        if item.get("status") == "firing" and late:
            posted["endsAt"] = iso(datetime.fromisoformat(item["endsAt"]) + late)
        alerts.append(posted)
    return url + API_PATH, alerts


def _stream(receiver: str, key: str) -> str:
    """The outbox stream of one Alertmanager of a receiver (keys ``<stream>-<sequence>``, as
    ``alerts.payloads`` makes them for groups)."""
    return hashlib.sha256(f"{receiver}\x00{key}".encode()).hexdigest()[:32]


def _names(pairs: Mapping[str, str]) -> dict[str, str]:
    """Label or annotation names Alertmanager takes; empty values left out (absent, to it)."""
    out: dict[str, str] = {}
    for name, value in sorted(pairs.items()):
        if value == "":
            continue
        fixed = _BAD_CHARS.sub("_", name)
        out.setdefault(fixed if fixed[:1].isalpha() or fixed[:1] == "_" else f"_{fixed}", value)
    return out
