"""ClickHouse client factory: a store URL -> a clickhouse-connect ``Client``.

In:  ``chdb:PATH`` / ``chdb:///abs/path`` (embedded chDB, the default) or
     ``http(s)://user:password@host:port/database`` (a ClickHouse server or cluster).
Out: a clickhouse-connect ``Client``; every caller uses the same API (``query``,
     ``query_df``, ``insert``, ``insert_df``, ``command``) and the same SQL on both.

chDB opens one data directory per process (and a directory held by another process
cannot be opened at all), so embedded clients are opened through here, which turns
those failures into a ``StoreUnavailable`` that says what to do.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from storage.errors import StoreUnavailable

__all__ = ["Client", "StoreTarget", "connect", "ensure_database", "parse_url"]

# Timestamps come back as timezone-aware UTC datetimes on both backends.
TZ_MODE = "aware"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class StoreTarget:
    """A parsed store URL: ``kind`` is ``chdb`` or ``server``."""

    kind: str
    url: str
    path: Path | None = None  # chdb only: absolute data directory
    database: str | None = None

    def describe(self) -> str:
        """A password-free description for messages and logs."""
        if self.kind == "chdb":
            return f"chDB store at {self.path}"
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        return f"ClickHouse server {parts.scheme}://{parts.hostname}{port}/{self.database or 'default'}"


def parse_url(url: str, base_dir: Path | None = None) -> StoreTarget:
    """Parse a store URL. Relative chDB paths are resolved against ``base_dir`` (or cwd)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "chdb":
        rest = url[len("chdb:") :]
        if rest.startswith("//"):
            rest = rest[2:]  # chdb:///abs -> /abs ; chdb://rel -> rel
        if not rest:
            raise StoreUnavailable(f"chDB URL {url!r} names no directory (e.g. chdb:data/clickhouse)")
        path = Path(rest).expanduser()
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        return StoreTarget(kind="chdb", url=url, path=path.resolve())
    if scheme in {"http", "https"}:
        parts = urlsplit(url)
        database = parts.path.strip("/") or None
        return StoreTarget(kind="server", url=url, database=database)
    raise StoreUnavailable(f"unsupported ClickHouse URL {url!r}: use chdb:PATH or http(s)://host:port/database")


def is_embedded(client: Any) -> bool:
    """Whether ``client`` is the in-process chDB store (a local path is this process's own there;
    a server reads only its own)."""
    return type(client).__name__ == "ChdbClient"


def ensure_database(client: Client, database: str) -> None:
    """Create ``database`` if it does not exist (identifier-checked)."""
    if not _IDENTIFIER.match(database):
        raise StoreUnavailable(f"invalid ClickHouse database name {database!r}")
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")


def connect(
    url: str,
    *,
    database: str | None = None,
    create_database: bool = False,
    connect_timeout_s: float = 10.0,
    query_timeout_s: float = 300.0,
    settings: dict[str, Any] | None = None,
) -> Client:
    """Open a client for ``url``. Raises ``StoreUnavailable`` with an actionable message.

    ``database`` overrides the URL's database; with ``create_database`` it is created first.
    """
    target = parse_url(url)
    database = database or target.database
    if target.kind == "chdb":
        return _connect_chdb(target, database, create_database, settings)
    return _connect_server(target, database, create_database, connect_timeout_s, query_timeout_s, settings)


def _connect_chdb(
    target: StoreTarget, database: str | None, create_database: bool, settings: dict[str, Any] | None
) -> Client:
    assert target.path is not None
    try:
        target.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreUnavailable(f"cannot create chDB directory {target.path}: {exc.strerror}") from None
    dsn = f"chdb://{target.path}"
    with _captured_stderr() as captured:
        try:
            if database and create_database:
                bootstrap = clickhouse_connect.get_client(dsn=dsn)
                try:
                    ensure_database(bootstrap, database)
                finally:
                    bootstrap.close()
            return clickhouse_connect.get_client(dsn=dsn, database=database, settings=settings or {}, tz_mode=TZ_MODE)
        except StoreUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - chdb raises several types for these
            captured.failed = True
            message = _explain_chdb_failure(target, f"{exc}\n{captured.text()}")
    raise StoreUnavailable(message)


class _Captured:
    def __init__(self, file: Any) -> None:
        self.file = file
        self.failed = False

    def text(self) -> str:
        self.file.flush()
        self.file.seek(0)
        data: bytes = self.file.read()
        return data.decode("utf-8", "replace")


@contextmanager
def _captured_stderr() -> Iterator[_Captured]:
    """Hold what the chDB engine writes to fd 2 while it opens.

    On failure it becomes part of the explanation (the engine prints the real reason,
    e.g. the lock conflict, there rather than in the exception); on success it is written
    back to stderr unchanged, so nothing is lost.
    """
    with tempfile.TemporaryFile() as tmp:
        captured = _Captured(tmp)
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not captured.failed:
                text = captured.text()
                if text:
                    sys.stderr.write(text)


def _explain_chdb_failure(target: StoreTarget, text: str) -> str:
    if "Cannot lock file" in text or "Another server instance" in text:
        return (
            f"{target.describe()} is held by another process (is `fleetscope up` running?). "
            "chDB allows one process per directory: query it through that process "
            "(`fleetscope sql` finds it), or stop it first"
        )
    if "already initialized with path" in text:
        return (
            f"cannot open {target.describe()}: this process already has a different chDB "
            "directory open (chDB allows one per process)"
        )
    if "does not exist" in text and "Database" in text:
        return f"{target.describe()}: {text.strip().splitlines()[0]} (run `fleetscope migrate` first)"
    first = next((line for line in text.splitlines() if line.strip()), "unknown error")
    return f"cannot open {target.describe()}: {first}"


def _connect_server(
    target: StoreTarget,
    database: str | None,
    create_database: bool,
    connect_timeout_s: float,
    query_timeout_s: float,
    settings: dict[str, Any] | None,
) -> Client:
    common: dict[str, Any] = {
        "dsn": target.url,
        "connect_timeout": connect_timeout_s,
        "send_receive_timeout": query_timeout_s,
        "settings": settings or {},
        "tz_mode": TZ_MODE,
    }
    try:
        if database and create_database:
            bootstrap = clickhouse_connect.get_client(**{**common, "database": "default"})
            try:
                ensure_database(bootstrap, database)
            finally:
                bootstrap.close()
        return clickhouse_connect.get_client(**common, database=database or "default")
    except StoreUnavailable:
        raise
    except (ClickHouseError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreUnavailable(f"cannot reach {target.describe()}: {first}") from exc
