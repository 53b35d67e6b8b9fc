"""Delivery: due outbox rows -> HTTP POSTs to their receivers -> each row delivered, retried or failed.

In:  the metadata DB's outbox (``alerts.outbox``), the configured receivers by name
     (``ReceiverConfig``), an ``httpx.Client`` and the time ``now``.
Out: one POST per due row (JSON body; headers ``Content-Type: application/json``,
     ``Idempotency-Key: <row key>``, ``User-Agent: fleetscope``, the receiver's own headers and,
     with ``hmac_secret``, ``X-Fleetscope-Signature-256: sha256=<hex HMAC-SHA256 of the body
     bytes>``; an ``alertmanager`` receiver's row goes to ``<its Alertmanager>/api/v2/alerts`` as
     the array ``alerts.alertmanager.request`` makes); the row's new state; a ``DeliveryReport``
     per pass.

Retry policy (Alertmanager's, with PagerDuty's Retry-After habit):
    2xx                        delivered
    5xx, network error/timeout retry after base·2^(attempts−1) s ±20 % jitter, at most the cap
    429                        retry after Retry-After (seconds or HTTP-date, at most 1 h;
                               without one, the backoff above)
    any other status           failed at once, keeping the status and the first 500 characters
                               of the answer (a 4xx will not get better by sending it again)
    receiver not configured    failed, saying so
    older than max_age_h       failed: "gave up after N attempts over H h: <last error>"
When a receiver cannot be reached or answers 429, its other due rows in the same pass are not
sent: they are deferred to the same retry time (one probe per receiver instead of a request per
row to a receiver that is down or rate-limiting us); for an ``alertmanager`` receiver that is
one Alertmanager, so the others of an HA set still get theirs. Errors of an Alertmanager name
its URL ("Alertmanager at http://...: ConnectError: ..."). A 5xx defers only its own row, so one body
a receiver chokes on cannot hold the others back.

Delivery is at least once: a row is marked after its POST returns, so a crash (or a metadata
DB failure) in between sends it again later with the same ``Idempotency-Key``; receivers that
must not act twice deduplicate on it (PagerDuty does on ``dedup_key``).
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import logging
import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self

import httpx
from sqlalchemy.orm import Session, sessionmaker

from alerts import alertmanager, outbox
from alerts.errors import ReceiverError
from alerts.receivers import ReceiverConfig
from common.timeutil import as_utc, aware_utc

__all__ = ["SIGNATURE_HEADER", "Deliverer", "DeliveryReport", "retry_after_seconds", "sign"]

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Fleetscope-Signature-256"
USER_AGENT = "fleetscope"
JITTER = 0.2  # ±20 %
RETRY_AFTER_CAP_S = 3600.0
ERROR_TEXT_CHARS = 500  # of a receiver's answer kept with a failure
BATCH = 100  # rows per pass


@dataclass(frozen=True)
class DeliveryReport:
    """What one pass did."""

    due: int = 0  # rows that were due
    sent: int = 0  # requests made (or tried: a refused connection counts)
    delivered: int = 0
    retrying: int = 0  # sent, failed, scheduled again
    deferred: int = 0  # not sent: their receiver was unreachable or rate-limiting in this pass
    failed: int = 0  # given up for good


@dataclass(frozen=True)
class _Outcome:
    kind: str  # "delivered" | "retry" | "failed"
    status: int | None
    error: str
    delay_s: float = 0.0
    hold_receiver: bool = False  # the receiver as a whole is unavailable: defer its other rows


class Deliverer:
    """Sends due outbox rows; one pass with ``run_once``, a loop with ``run``."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        receivers: Mapping[str, ReceiverConfig],
        *,
        client: httpx.Client | None = None,
        rng: random.Random | None = None,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 60.0,
    ) -> None:
        if not 0 < backoff_base_s <= backoff_cap_s:
            raise ValueError(f"need 0 < backoff_base_s <= backoff_cap_s, got {backoff_base_s} and {backoff_cap_s}")
        self.sessions = sessions
        self.receivers = dict(receivers)
        self._own_client = client is None
        self.client = client if client is not None else httpx.Client(follow_redirects=False)
        self.rng = rng if rng is not None else random.Random()
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s

    def close(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._own_client:
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_once(self, now: datetime | None = None) -> DeliveryReport:
        """Send every row due at ``now`` once (see the module docstring for what follows)."""
        now = aware_utc(now, "delivery times")
        rows = outbox.due(self.sessions, now, limit=BATCH)
        streams = outbox.pending_by_stream(self.sessions) if rows else {}
        counts = {"sent": 0, "delivered": 0, "retrying": 0, "deferred": 0, "failed": 0}
        held: dict[str, tuple[datetime, str]] = {}  # receiver -> (retry time, why) for this pass
        for row in rows:
            receiver = self.receivers.get(row.receiver)
            if receiver is None:
                self._fail(
                    row, None, f"receiver {row.receiver!r} is no longer configured: not delivered", attempted=False
                )
                counts["failed"] += 1
                continue
            if now - row.created_at > timedelta(hours=receiver.max_age_h):
                last = row.last_error or "no answer recorded"
                self._fail(
                    row,
                    row.last_status,
                    f"gave up after {row.attempts} attempts over {receiver.max_age_h:g} h: {last}",
                    attempted=False,
                )
                counts["failed"] += 1
                continue
            waiting = streams.get(outbox.stream(row.key), [])
            if waiting and waiting[0][0] != row.id:  # an older notification of its group is not delivered yet
                outbox.mark_retry(
                    self.sessions,
                    row.key,
                    max(now, waiting[0][1]),
                    None,
                    "not sent: waiting for an earlier notification of its group",
                    attempted=False,
                )
                counts["deferred"] += 1
                continue
            destination = _destination(receiver, row)
            if destination in held:
                until, why = held[destination]
                outbox.mark_retry(self.sessions, row.key, until, None, f"not sent: {why}", attempted=False)
                counts["deferred"] += 1
                continue
            outcome = self._send(receiver, row, now)
            counts["sent"] += 1
            if outcome.kind == "delivered":
                outbox.mark_delivered(self.sessions, row.key, now, outcome.status or 200)
                counts["delivered"] += 1
                if waiting:
                    waiting.pop(0)  # the next of its group may go in this pass
            elif outcome.kind == "failed":
                self._fail(row, outcome.status, outcome.error, attempted=True)
                counts["failed"] += 1
                if waiting:
                    waiting.pop(0)
            else:
                at = now + timedelta(seconds=outcome.delay_s)
                outbox.mark_retry(self.sessions, row.key, at, outcome.status, outcome.error)
                counts["retrying"] += 1
                log.warning(
                    "notification %s to receiver %s not delivered (status %s: %s); attempt %d, next at %s",
                    row.key,
                    row.receiver,
                    outcome.status,
                    outcome.error,
                    row.attempts + 1,
                    at.isoformat(),
                )
                if outcome.hold_receiver:
                    held[destination] = (at, f"receiver {row.receiver!r} was unavailable ({outcome.error})")
        return DeliveryReport(due=len(rows), **counts)

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Pass after pass until ``stop`` is set; a failing pass (metadata DB down) is logged and retried."""
        while not stop.is_set():
            try:
                report = self.run_once()
            except Exception:  # the loop must outlive a database hiccup
                log.warning("notification delivery pass failed; retrying in %g s", poll_s, exc_info=True)
                stop.wait(poll_s)
                continue
            if report.due < BATCH:  # a full batch: more may be due at once
                stop.wait(poll_s)

    # ----------------------------------------------------------------------- one request

    def _send(self, receiver: ReceiverConfig, row: outbox.OutboxRow, now: datetime) -> _Outcome:
        url, where = receiver.url, ""
        content: dict[str, Any] | list[dict[str, Any]] = row.body
        if receiver.type == "alertmanager":  # the v2 API: a JSON array, to the row's Alertmanager
            try:
                url, content = alertmanager.request(receiver, row.body, row.created_at, now)
            except ReceiverError as exc:
                return _Outcome("failed", None, str(exc))
            where = f"Alertmanager at {url}: "
        data = json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()
        headers = {"User-Agent": USER_AGENT, **receiver.headers}
        headers.update({"Content-Type": "application/json", "Idempotency-Key": row.key})
        if receiver.hmac_secret is not None:
            headers[SIGNATURE_HEADER] = sign(receiver.hmac_secret.get_secret_value(), data)
        try:
            response = self.client.post(url, content=data, headers=headers, timeout=receiver.timeout_s)
        except httpx.HTTPError as exc:  # refused, reset, DNS, timeout ...
            error = where + (f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__)
            return _Outcome("retry", None, error, self._backoff(row.attempts + 1), hold_receiver=True)
        code = response.status_code
        if 200 <= code < 300:
            return _Outcome("delivered", code, "")
        error = f"{where}HTTP {code}: {response.text[:ERROR_TEXT_CHARS]}".rstrip()
        if code == 429:
            wait = retry_after_seconds(response.headers.get("Retry-After"), now)
            delay = wait if wait is not None else self._backoff(row.attempts + 1)
            return _Outcome("retry", code, error, delay, hold_receiver=True)
        if code >= 500:
            return _Outcome("retry", code, error, self._backoff(row.attempts + 1))
        return _Outcome("failed", code, error)

    def _backoff(self, attempts: int) -> float:
        """Seconds before attempt ``attempts + 1``: base·2^(attempts−1), ±jitter, at most the cap."""
        raw = self.backoff_base_s * 2.0 ** min(max(attempts - 1, 0), 60)
        return min(self.backoff_cap_s, raw * self.rng.uniform(1 - JITTER, 1 + JITTER))

    def _fail(self, row: outbox.OutboxRow, status: int | None, error: str, *, attempted: bool) -> None:
        outbox.mark_failed(self.sessions, row.key, status, error, attempted=attempted)
        log.warning("notification %s to receiver %s failed (status %s): %s", row.key, row.receiver, status, error)


def _destination(receiver: ReceiverConfig, row: outbox.OutboxRow) -> str:
    """What one unreachable endpoint holds back: the receiver, or one Alertmanager of an HA set
    (the others must still get their pushes)."""
    if receiver.type == "alertmanager":
        return f"{row.receiver}\x00{row.body.get('url', '')}"
    return row.receiver


def sign(secret: str, body: bytes) -> str:
    """The ``X-Fleetscope-Signature-256`` value for ``body``: ``sha256=<hex HMAC>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), 0..1 h; None if unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        when = as_utc(when)
        seconds = (when - now).total_seconds()
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)
