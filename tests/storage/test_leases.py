"""Leases on SQLite and PostgreSQL after the real migrations: one holder at a time, even racing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine

from migrations import metadata_runner
from storage import leases
from storage.metadata import make_engine, make_sessionmaker

T0 = datetime(2026, 12, 6, 9, 0, 0, 123456, tzinfo=UTC)
TTL = 30.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def engine(metadata_url: str) -> Iterator[Engine]:
    metadata_runner.upgrade(metadata_url)
    engine = make_engine(metadata_url)
    yield engine
    engine.dispose()


def test_two_holders_contend_and_exactly_one_wins(engine: Engine) -> None:
    assert leases.holder_of(engine, "alerts", now=T0) is None
    assert leases.acquire(engine, "alerts", "a", TTL, now=T0) is True
    assert leases.acquire(engine, "alerts", "b", TTL, now=at(1)) is False
    assert leases.holder_of(engine, "alerts", now=at(1)) == "a"
    # another name is another lease
    assert leases.acquire(engine, "reports", "b", TTL, now=at(1)) is True


def test_the_holder_renews_and_keeps_it(engine: Engine) -> None:
    assert leases.acquire(engine, "alerts", "a", TTL, now=T0)
    assert leases.acquire(engine, "alerts", "a", TTL, now=at(10))  # renewal
    state = leases.read(engine, "alerts")
    assert state == leases.LeaseState("alerts", "a", T0, at(10), at(40))
    assert state.expires_at.tzinfo is not None and state.expires_at.utcoffset() == timedelta(0)
    # past the first expiry (T0 + 30) the renewed lease still holds
    assert leases.acquire(engine, "alerts", "b", TTL, now=at(35)) is False
    assert leases.holder_of(engine, "alerts", now=at(35)) == "a"


def test_the_standby_takes_over_only_after_expiry(engine: Engine) -> None:
    assert leases.acquire(engine, "alerts", "active", TTL, now=T0)
    assert leases.acquire(engine, "alerts", "standby", TTL, now=at(29.999)) is False
    assert leases.holder_of(engine, "alerts", now=at(29.999)) == "active"
    assert leases.holder_of(engine, "alerts", now=at(30)) is None  # held until expires_at, exclusive
    assert leases.acquire(engine, "alerts", "standby", TTL, now=at(30)) is True
    assert leases.holder_of(engine, "alerts", now=at(31)) == "standby"
    # the old holder comes back late: it has lost the lease and must stop
    assert leases.acquire(engine, "alerts", "active", TTL, now=at(31)) is False
    assert leases.read(engine, "alerts") == leases.LeaseState("alerts", "standby", at(30), at(30), at(60))


def test_a_lapsed_holder_that_reacquires_starts_a_new_holding(engine: Engine) -> None:
    assert leases.acquire(engine, "alerts", "a", TTL, now=T0)
    assert leases.acquire(engine, "alerts", "a", TTL, now=at(100))  # nobody took it meanwhile
    state = leases.read(engine, "alerts")
    assert state is not None and state.acquired_at == at(100) and state.held_at(at(129)) and not state.held_at(at(130))


def test_release_frees_the_lease_at_once(engine: Engine) -> None:
    assert leases.acquire(engine, "alerts", "a", TTL, now=T0)
    assert leases.release(engine, "alerts", "b") is False  # not b's to give up
    assert leases.holder_of(engine, "alerts", now=at(1)) == "a"
    assert leases.release(engine, "alerts", "a") is True
    assert leases.holder_of(engine, "alerts", now=at(1)) is None
    assert leases.read(engine, "alerts") is None
    assert leases.acquire(engine, "alerts", "b", TTL, now=at(1)) is True
    assert leases.release(engine, "missing", "a") is False


def test_times_in_any_zone_are_the_same_instant(engine: Engine) -> None:
    plus_two = T0.astimezone(timezone(timedelta(hours=2)))
    assert leases.acquire(engine, "alerts", "a", TTL, now=plus_two)
    assert leases.read(engine, "alerts").acquired_at == T0
    assert leases.holder_of(engine, "alerts", now=at(29).astimezone(timezone(timedelta(hours=-5)))) == "a"
    with pytest.raises(ValueError, match="timezone-aware"):
        leases.acquire(engine, "alerts", "a", TTL, now=datetime(2026, 12, 6, 9))  # noqa: DTZ001 - naive on purpose
    with pytest.raises(ValueError, match="ttl_s"):
        leases.acquire(engine, "alerts", "a", 0)


def test_default_now_is_the_wall_clock(engine: Engine) -> None:
    holder = leases.holder_id()
    assert leases.acquire(engine, "alerts", holder, TTL)
    assert leases.holder_of(engine, "alerts") == holder
    assert leases.acquire(engine, "alerts", "other", TTL) is False


def test_inside_a_session_the_caller_commits(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        assert leases.acquire(session, "alerts", "a", TTL, now=T0)
        assert leases.holder_of(session, "alerts", now=T0) == "a"
    assert leases.holder_of(engine, "alerts", now=at(1)) == "a"
    with sessions() as session:
        assert leases.acquire(session, "alerts", "b", TTL, now=at(1)) is False
        assert leases.release(session, "alerts", "a")
        session.rollback()
    assert leases.holder_of(engine, "alerts", now=at(1)) == "a"  # rolled back: still held


def race(url: str, names: list[str], now: datetime) -> list[list[bool]]:
    """Two threads, each with its own engine (as two processes would), call ``acquire`` on
    every name at the same moment; returns each thread's answers."""
    barrier = threading.Barrier(2, timeout=60)
    answers: list[list[bool]] = [[], []]
    errors: list[BaseException] = []

    def contend(index: int) -> None:
        engine = make_engine(url)
        try:
            for name in names:
                barrier.wait()
                answers[index].append(leases.acquire(engine, name, f"holder-{index}", TTL, now=now))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
            barrier.abort()
        finally:
            engine.dispose()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return answers


def test_racing_holders_never_both_win(engine: Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    names = [f"race-{i}" for i in range(100)]
    # a race to create each lease (INSERT), then, once all have expired, a race to take it over (UPDATE)
    for now in (T0, at(TTL + 1)):
        first, second = race(url, names, now)
        assert len(first) == len(second) == len(names)
        assert all(a != b for a, b in zip(first, second, strict=True)), "both or neither won a lease"
        for name, won in zip(names, first, strict=True):
            assert leases.holder_of(engine, name, now=now) == ("holder-0" if won else "holder-1")
