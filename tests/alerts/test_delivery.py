"""Outbox and delivery against a real local HTTP receiver, on SQLite and PostgreSQL.

The receiver is a real ``ThreadingHTTPServer`` on 127.0.0.1 that answers from a script and
records every request. Time is simulated: each pass gets ``now``; nothing here sleeps for a
backoff, and no test asserts a wall-clock duration.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from alerts import outbox
from alerts.delivery import Deliverer
from alerts.model import Alert
from alerts.payloads import Notification, bodies
from alerts.receivers import ReceiverConfig
from storage.metadata import make_engine, make_sessionmaker
from tests.alerts.receiver import ScriptedReceiver
from tests.conftest import migrated_sessions

T0 = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def start_receiver() -> Iterator[Callable[..., ScriptedReceiver]]:
    started: list[ScriptedReceiver] = []

    def start(port: int = 0) -> ScriptedReceiver:
        server = ScriptedReceiver(port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def closed_port() -> int:
    """A port nobody listens on (reserved, then closed): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sessions(metadata_url: str) -> Iterator[Any]:
    yield from migrated_sessions(metadata_url)


# --------------------------------------------------------------------------- helpers


def webhook(port: int, **fields: Any) -> ReceiverConfig:
    return ReceiverConfig(**{"name": "ops", "type": "webhook", "url": f"http://127.0.0.1:{port}/hook", **fields})


def enqueue(sessions: Any, receiver: ReceiverConfig, count: int, now: datetime = T0) -> list[str]:
    """``count`` notifications (one group each) through the real payload code; their keys."""
    keys = []
    for i in range(count):
        a = Alert(
            labels={"alertname": "KVCacheSaturated", "replica": f"r-{i}"},
            annotations={"summary": f"KV cache full on r-{i}"},
            status="firing",
            starts_at=now,
            value=0.97,
        )
        n = Notification(
            receiver=receiver.name,
            group_key=f'{{}}:{{replica="r-{i}"}}',
            group_labels={"replica": f"r-{i}"},
            alerts=[a],
            external_url="",
            sequence=1,
        )
        for key, body in bodies(receiver, n):
            assert outbox.enqueue(sessions, key, receiver.name, body, now)
            keys.append(key)
    return keys


def rows(sessions: Any) -> dict[str, outbox.OutboxRow]:
    return {r.key: r for r in outbox.log(sessions, limit=1000)}


def next_due(sessions: Any) -> datetime | None:
    pending = [r.next_attempt_at for r in rows(sessions).values() if r.status == "pending"]
    return min(pending, default=None)


def drive(
    deliverer: Deliverer,
    sessions: Any,
    start: datetime,
    until: datetime,
    after_pass: Callable[[datetime], None] | None = None,
) -> datetime:
    """Run passes at each next due time from ``start`` while that is before ``until``; the last ``now``."""
    now = start
    for _ in range(10_000):
        deliverer.run_once(now)
        if after_pass:
            after_pass(now)
        nxt = next_due(sessions)
        if nxt is None or nxt >= until:
            return now
        now = max(now, nxt)
    raise AssertionError("delivery did not settle")


# --------------------------------------------------------------------------- outbox


def test_enqueue_is_idempotent_even_when_racing(sessions: Any) -> None:
    assert outbox.enqueue(sessions, "k-1", "ops", {"n": 1}, T0) is True
    assert outbox.enqueue(sessions, "k-1", "ops", {"n": 2}, at(5)) is False
    [row] = outbox.log(sessions)
    assert (row.key, row.body, row.created_at, row.status, row.attempts) == ("k-1", {"n": 1}, T0, "pending", 0)

    barrier = threading.Barrier(4)
    results: list[bool] = []

    def racer(i: int) -> None:
        barrier.wait()
        results.append(outbox.enqueue(sessions, "k-race", "ops", {"racer": i}, T0))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [False, False, False, True]
    assert outbox.counts(sessions) == {"pending": 2, "delivered": 0, "failed": 0}


def test_log_is_newest_first_filters_by_receiver_and_hides_routing_keys(sessions: Any) -> None:
    outbox.enqueue(sessions, "a", "ops", {"n": 1}, T0)
    outbox.enqueue(sessions, "b", "oncall", {"routing_key": "SECRET", "event_action": "trigger"}, at(1))
    outbox.enqueue(sessions, "c", "ops", {"n": 3}, at(2))
    assert [r.key for r in outbox.log(sessions)] == ["c", "b", "a"]
    assert [r.key for r in outbox.log(sessions, receiver="ops")] == ["c", "a"]
    assert [r.key for r in outbox.log(sessions, limit=1)] == ["c"]
    assert outbox.log(sessions, receiver="oncall")[0].body["routing_key"] != "SECRET"
    # the deliverer still gets the real body, due oldest first and only once due
    assert [r.key for r in outbox.due(sessions, at(1))] == ["a", "b"]
    assert outbox.due(sessions, at(1))[1].body["routing_key"] == "SECRET"


# --------------------------------------------------------------------------- retries


def test_500s_then_recovery_delivers_each_notification_once_with_growing_backoff(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver], caplog: pytest.LogCaptureFixture
) -> None:
    server = start_receiver()
    server.answer(500, times=12, text="upstream exploded")
    receiver = webhook(server.port)
    keys = enqueue(sessions, receiver, 3)
    delays: dict[str, list[float]] = {k: [] for k in keys}
    seen_attempts = dict.fromkeys(keys, 0)

    def record(now: datetime) -> None:
        for key, row in rows(sessions).items():
            if row.status == "pending" and row.attempts > seen_attempts[key]:
                delays[key].append((row.next_attempt_at - now).total_seconds())
            seen_attempts[key] = row.attempts

    cap = 5.0
    with (
        caplog.at_level(logging.WARNING, logger="alerts.delivery"),
        Deliverer(sessions, {"ops": receiver}, rng=random.Random(7), backoff_cap_s=cap) as d,
    ):
        drive(d, sessions, T0, at(3600), record)

    assert outbox.counts(sessions) == {"pending": 0, "delivered": 3, "failed": 0}
    assert set(server.accepted()) == set(keys) and set(server.accepted().values()) == {1}
    assert {r.key for r in server.requests} == set(keys)
    assert len(server.requests) == 12 + 3
    for key in keys:
        spacing = delays[key]
        assert spacing, "every notification was retried"
        assert all(0 < s <= cap for s in spacing)
        # grows until it reaches the cap, then stays there
        assert all(b > a or a == b == cap for a, b in itertools.pairwise(spacing)), spacing
        for attempt, s in enumerate(spacing, start=1):
            assert min(cap, 0.8 * 2 ** (attempt - 1)) <= s <= min(cap, 1.2 * 2 ** (attempt - 1))
    assert any(v[-1] == cap for v in delays.values())  # some notification backed off to the cap
    final = rows(sessions)
    assert all(r.last_status == 200 and r.attempts == 1 + len(delays[k]) for k, r in final.items())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and all("ops" in r.getMessage() and "500" in r.getMessage() for r in warned)
    assert {k for k in keys if any(k in r.getMessage() for r in warned)} == set(keys)


def test_a_groups_resolve_never_overtakes_its_trigger_while_the_trigger_is_retried(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver]
) -> None:
    server = start_receiver()
    server.answer(503, times=2)  # the trigger meets a failing receiver twice
    receiver = webhook(server.port)
    alert = Alert(
        labels={"alertname": "KVCacheSaturated", "replica": "r-0"},
        annotations={},
        status="firing",
        starts_at=T0,
        value=0.97,
    )
    group = {
        "receiver": "ops",
        "group_key": '{}:{alertname="KVCacheSaturated"}',
        "group_labels": {},
        "external_url": "",
    }
    [(trigger, body)] = bodies(receiver, Notification(alerts=[alert], sequence=1, **group))
    outbox.enqueue(sessions, trigger, "ops", body, T0)
    deliverer = Deliverer(sessions, {"ops": receiver}, rng=random.Random(3))
    deliverer.run_once(T0)  # 503: the trigger backs off
    resolved = Alert(labels=alert.labels, annotations={}, status="resolved", starts_at=T0, ends_at=at(1))
    [(resolve, body)] = bodies(receiver, Notification(alerts=[resolved], sequence=2, **group))
    outbox.enqueue(sessions, resolve, "ops", body, at(1))
    report = deliverer.run_once(at(1))  # the resolve is due, its trigger is not: it waits
    assert report.deferred == 1 and server.accepted() == {}
    drive(deliverer, sessions, at(2), at(600))
    order = [json.loads(r.body)["status"] for r in server.requests if 200 <= r.answered < 300]
    assert order == ["firing", "resolved"]
    assert server.accepted() == {trigger: 1, resolve: 1}


def test_receiver_down_for_an_hour_then_up_gets_everything_once(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver]
) -> None:
    port = closed_port()
    receiver = webhook(port)
    keys = enqueue(sessions, receiver, 3)
    with Deliverer(sessions, {"ops": receiver}, rng=random.Random(1), backoff_cap_s=60) as d:
        now = drive(d, sessions, T0, at(3600))
        assert outbox.counts(sessions) == {"pending": 3, "delivered": 0, "failed": 0}
        state = rows(sessions)
        probe = state[keys[0]]
        assert probe.attempts > 5 and "ConnectError" in (probe.last_error or "")
        # while it is down, only the oldest row probes it; the others wait with it
        assert all(state[k].attempts == 0 and "not sent" in (state[k].last_error or "") for k in keys[1:])

        server = start_receiver(port)
        drive(d, sessions, max(now, next_due(sessions) or now), at(7200))
    assert outbox.counts(sessions) == {"pending": 0, "delivered": 3, "failed": 0}
    assert server.accepted() == Counter(dict.fromkeys(keys, 1))
    assert len(server.requests) == 3


def test_a_400_is_not_retried(sessions: Any, start_receiver: Callable[..., ScriptedReceiver]) -> None:
    server = start_receiver()
    server.answer(400, text="bad payload: " + "x" * 1000)
    receiver = webhook(server.port)
    [key] = enqueue(sessions, receiver, 1)
    with Deliverer(sessions, {"ops": receiver}) as d:
        report = d.run_once(T0)
        assert (report.sent, report.failed) == (1, 1)
        for later in (60, 3600, 86400):
            assert d.run_once(at(later)).due == 0
    assert len(server.requests) == 1
    row = rows(sessions)[key]
    assert (row.status, row.last_status, row.attempts) == ("failed", 400, 1)
    assert row.last_error == "HTTP 400: bad payload: " + "x" * (500 - len("bad payload: "))


@pytest.mark.parametrize("retry_after", ["30", "http-date", None])
def test_429_waits_for_retry_after(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver], retry_after: str | None
) -> None:
    server = start_receiver()
    if retry_after == "http-date":
        header, wait = {"Retry-After": format_datetime(at(120), usegmt=True)}, 120.0
    elif retry_after is not None:
        header, wait = {"Retry-After": retry_after}, 30.0
    else:
        header, wait = {}, None  # the backoff: 1 s ± 20 %
    server.answer(429, headers=header, text="slow down")
    receiver = webhook(server.port)
    keys = enqueue(sessions, receiver, 2)
    with Deliverer(sessions, {"ops": receiver}, rng=random.Random(3)) as d:
        report = d.run_once(T0)
        assert (report.sent, report.retrying, report.deferred) == (1, 1, 1)  # the second is held back too
        retry_at = rows(sessions)[keys[0]].next_attempt_at
        if wait is not None:
            assert retry_at == at(wait)
        else:
            assert at(0.8) <= retry_at <= at(1.2)
        assert all(r.next_attempt_at == retry_at for r in rows(sessions).values())
        assert d.run_once(retry_at - timedelta(milliseconds=1)).sent == 0
        assert len(server.requests) == 1
        assert d.run_once(retry_at).delivered == 2
    assert server.accepted() == Counter(dict.fromkeys(keys, 1))
    assert rows(sessions)[keys[0]].attempts == 2 and rows(sessions)[keys[1]].attempts == 1


def test_a_killed_deliverer_leaves_rows_that_a_new_one_delivers(
    sqlite_url: str, start_receiver: Callable[..., ScriptedReceiver]
) -> None:
    port = closed_port()
    receiver = webhook(port)
    first_sessions = next(migrated_sessions(sqlite_url))
    keys = enqueue(first_sessions, receiver, 3)
    first = Deliverer(first_sessions, {"ops": receiver}, rng=random.Random(2))
    first.run_once(T0)
    first.run_once(at(30))
    first.close()
    first_sessions.kw["bind"].dispose()  # the process is gone: nothing of it survives but the file
    del first, first_sessions

    server = start_receiver(port)
    engine = make_engine(sqlite_url)
    try:
        again = make_sessionmaker(engine)
        assert outbox.counts(again)["pending"] == 3
        with Deliverer(again, {"ops": receiver}) as d:
            drive(d, again, at(600), at(7200))
        assert outbox.counts(again) == {"pending": 0, "delivered": 3, "failed": 0}
    finally:
        engine.dispose()
    assert server.accepted() == Counter(dict.fromkeys(keys, 1))


def test_gives_up_after_max_age_with_the_last_error(sessions: Any) -> None:
    receiver = webhook(closed_port(), max_age_h=0.5)
    keys = enqueue(sessions, receiver, 2)
    with Deliverer(sessions, {"ops": receiver}) as d:
        drive(d, sessions, T0, at(7200))
    state = rows(sessions)
    assert outbox.counts(sessions) == {"pending": 0, "delivered": 0, "failed": 2}
    probe = state[keys[0]]
    assert probe.last_error is not None
    assert probe.last_error.startswith(f"gave up after {probe.attempts} attempts over 0.5 h: ConnectError")
    assert state[keys[1]].last_error.startswith("gave up after 0 attempts over 0.5 h: not sent")


def test_a_row_for_a_receiver_no_longer_configured_fails_saying_so(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver]
) -> None:
    server = start_receiver()
    [key] = enqueue(sessions, webhook(server.port, name="old-team"), 1)
    with Deliverer(sessions, {"ops": webhook(server.port)}) as d:
        assert d.run_once(T0).failed == 1
    row = rows(sessions)[key]
    assert row.status == "failed" and row.attempts == 0
    assert row.last_error == "receiver 'old-team' is no longer configured: not delivered"
    assert server.requests == []


# --------------------------------------------------------------------------- the request itself


def test_signature_custom_headers_and_idempotency_key_arrive(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver]
) -> None:
    server = start_receiver()
    receiver = webhook(
        server.port, hmac_secret="s3cret", headers={"Authorization": "Bearer tok", "X-Team": "inference"}
    )
    [key] = enqueue(sessions, receiver, 1)
    with Deliverer(sessions, {"ops": receiver}) as d:
        assert d.run_once(T0).delivered == 1
    [seen] = server.requests
    expected = hmac.new(b"s3cret", seen.body, hashlib.sha256).hexdigest()
    assert seen.headers["x-fleetscope-signature-256"] == f"sha256={expected}"
    assert hmac.compare_digest(seen.headers["x-fleetscope-signature-256"], f"sha256={expected}")
    assert seen.headers["authorization"] == "Bearer tok" and seen.headers["x-team"] == "inference"
    assert seen.headers["idempotency-key"] == key
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["user-agent"] == "fleetscope"
    assert seen.path == "/hook"
    body = json.loads(seen.body)
    assert body["version"] == "4" and body["alerts"][0]["labels"]["replica"] == "r-0"
    assert rows(sessions)[key].delivered_at == T0


def test_no_signature_without_a_secret(sessions: Any, start_receiver: Callable[..., ScriptedReceiver]) -> None:
    server = start_receiver()
    receiver = webhook(server.port)
    enqueue(sessions, receiver, 1)
    with Deliverer(sessions, {"ops": receiver}) as d:
        d.run_once(T0)
    assert "x-fleetscope-signature-256" not in server.requests[0].headers


def test_the_loop_outlives_a_metadata_db_hiccup(
    sessions: Any, start_receiver: Callable[..., ScriptedReceiver], caplog: pytest.LogCaptureFixture
) -> None:
    server = start_receiver()
    receiver = webhook(server.port)
    [key] = enqueue(sessions, receiver, 1, now=datetime.now(UTC) - timedelta(seconds=1))
    failures = {"left": 3}

    def flaky() -> Any:
        """The real sessionmaker, except that the first calls find the database unreachable."""
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("database restarting"))
        return sessions()

    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="alerts.delivery"), Deliverer(flaky, {"ops": receiver}) as d:  # type: ignore[arg-type]
        loop = threading.Thread(target=d.run, args=(stop,), kwargs={"poll_s": 0.01}, daemon=True)
        loop.start()
        deadline = time.monotonic() + 4
        while outbox.counts(sessions)["delivered"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        loop.join(5)
    assert not loop.is_alive()
    assert server.accepted() == Counter({key: 1})
    assert sum("delivery pass failed" in r.getMessage() for r in caplog.records) == 3
