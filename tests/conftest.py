"""Shared fixtures: a real chDB store, a real PostgreSQL schema, a SQLite file.

chDB opens one data directory per process, so every in-process test shares one session
directory and gets a database of its own inside it. PostgreSQL tests get a schema of their
own in the ``test`` database (FLEETSCOPE_TEST_POSTGRES_URL overrides the server).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import pickle
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import create_engine, text

from storage.clickhouse import connect

ROOT = Path(__file__).resolve().parent.parent
IN_CI = bool(os.environ.get("CI"))


def missing(reason: str, *, module_level: bool = False) -> NoReturn:
    """A condition a test needs is not there: under CI (``CI`` set) that fails the test with the
    reason (CI must run everything: ``make test`` installs and starts what the suite needs);
    elsewhere the test is skipped with it, so a partial checkout still runs the rest."""
    if IN_CI:
        pytest.fail(f"CI cannot run this test: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def need(module: str, reason: str) -> Any:
    """``import module``, or ``missing(reason)`` at module level when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"{reason} ({module} is not installed)", module_level=True)


POSTGRES_URL = os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def chdb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture
def ch_database() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ch(chdb_dir: Path, ch_database: str) -> Iterator:
    """A clickhouse-connect client on a fresh database of the session's chDB store."""
    client = connect(f"chdb:{chdb_dir}", database=ch_database, create_database=True)
    try:
        yield client
    finally:
        client.command(f"DROP DATABASE IF EXISTS {ch_database}")
        client.close()


def migrated_sessions(url: str) -> Iterator:
    """A sessionmaker on the metadata DB at ``url``, migrated to head; disposed afterwards."""
    from migrations import metadata_runner
    from storage.metadata import make_engine, make_sessionmaker

    metadata_runner.upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'metadata.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a fresh schema in the test PostgreSQL database."""
    schema = f"fs_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
    except Exception as exc:  # noqa: BLE001 - turn any connection failure into one message
        admin.dispose()
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_URL} ({exc.__class__.__name__}): "
            "`make test` starts it via scripts/ensure-postgres.sh"
        )
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest) -> str:
    """The metadata DB on both supported backends."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(name)


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, timeout_s: float) -> None:
    """Stop ``loop``, run forever by ``thread``, wait for the thread and close the loop: what is left
    on it is finalised now, not by the garbage collector in the middle of a later test."""
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout_s)
    if not thread.is_alive():
        loop.close()


def in_own_process(fn: Callable[..., object], *args: object, timeout: float = 300) -> None:
    """Run the module-level ``fn(*args)`` in a fresh interpreter; a failure there (a failed assert
    included) fails here with its traceback. For checks that open a chDB directory other than the
    session's: chDB allows one per process, and the suite keeps its own open. (A plain subprocess,
    not multiprocessing: it must not inherit what other tests did to ``sys.argv`` or ``__main__``.)"""
    code = (
        "import importlib, pickle, sys; "
        "fn = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); fn(*pickle.loads(sys.stdin.buffer.read()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, fn.__module__, fn.__qualname__],
        input=pickle.dumps(args),
        capture_output=True,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{fn.__qualname__} failed in its own process:\n{done.stderr.decode()[-4000:]}")


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``fleetscope`` console script as a user would."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    full_env.update(env or {})
    exe = Path(sys.executable).parent / "fleetscope"
    return subprocess.run(
        [str(exe), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
