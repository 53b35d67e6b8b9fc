"""A store in another process, for the benches' "collector alone" figures.

In:  a chDB path and an optional ``prepare(client)`` (e.g. turn tables into Null ones), run in
     the other process after the migrations.
Out: ``RemoteStore``: the client methods the collector calls (``command``, ``query``,
     ``raw_insert``, ``insert_df``), run there; ``close()`` stops it and returns its CPU seconds.

It stands in for a ClickHouse server on another host, which cannot run here (named as such): the
collector's process pays for handing each insert over (a pipe write of its bytes, about what an
HTTP POST of them costs), not for the store's parsing, views and merges, as with the
anchors' set-ups, whose ClickHouse runs elsewhere.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def store_process(path: str, prepare: Callable[[Any], None] | None, conn: Any) -> None:
    """The other process's store: a real chDB (migrated, then ``prepare``d); runs what the pipe asks."""
    sys.path.insert(0, str(ROOT))
    os.chdir(Path(path).parent)  # where ClickHouse caches a schema sent with an insert (__cache__/)
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    client = connect(f"chdb:{path}")
    clickhouse_runner.apply(client)
    if prepare is not None:
        prepare(client)
    while True:
        call = conn.recv()
        if call is None:
            conn.send(cpu_seconds())
            return
        name, args, kwargs = call
        try:
            result = getattr(client, name)(*args, **kwargs)
            conn.send(("ok", result if name == "command" else None))
        except Exception as exc:  # noqa: BLE001 - handed back to the caller as the client would raise it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class RemoteStore:
    """Stands in for a ClickHouse server on another host (none can run here): the client methods
    the collector calls (``command``, ``query``, ``raw_insert``, ``insert_df``) run on a real chDB
    in another process, their arguments sent through a pipe."""

    def __init__(self, path: str, prepare: Callable[[Any], None] | None = None) -> None:
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: a fork can inherit a held lock
        self._conn, child = spawn.Pipe()
        self._process = spawn.Process(target=store_process, args=(path, prepare, child), daemon=True)
        self._process.start()
        self._lock = threading.Lock()

    def _call(self, name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        with self._lock:
            self._conn.send((name, args, kwargs))
            status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(result)
        return result

    def command(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._call("command", *args, **kwargs)

    def query(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._call("query", *args, **kwargs)

    def raw_insert(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        block = kwargs.get("insert_block")
        if block is not None and not isinstance(block, bytes | str):  # pieces, as an HTTP client streams them
            kwargs["insert_block"] = b"".join(block)
        return self._call("raw_insert", *args, **kwargs)

    def insert_df(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._call("insert_df", *args, **kwargs)

    def close(self) -> float | None:
        """Stop the store process; its CPU seconds."""
        with self._lock:
            self._conn.send(None)
            cpu = float(self._conn.recv())
        self._process.join(10)
        return cpu
