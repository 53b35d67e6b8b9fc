"""Running ad-hoc SQL read-only: checked text -> rows, under limits the text cannot change.

In:  the store URL (``chdb:PATH`` or ``http(s)://``), ``Limits`` (time, rows, memory), and the
     user's query text.
Out: ``Result`` (column names and ClickHouse types, rows, whether the row limit cut it, the time
     taken), ``schema()`` (tables, their columns, types and comments), or ``Refused`` (the
     statement check, ``adhoc.guard``) / ``QueryFailed`` (ClickHouse's own refusal or error,
     first line, e.g. the timeout).

Defence in depth: every query passes ``adhoc.guard.check`` first. Then:

- on chDB it runs on a client of its own whose session was set, before any user text, to the
  limits and then to ``readonly = 1``; in that mode ClickHouse refuses every later change of a
  setting, so neither ``SET`` nor a trailing ``SETTINGS readonly = 0`` can undo it;
- on a ClickHouse server the same settings ride on each request (HTTP parameters, ``readonly``
  last) and the guard refuses any ``SETTINGS`` clause; ``docs/operations.md`` shows the
  read-only user and settings profile that make the server enforce it too (then
  ``sql.server_enforces_readonly`` stops sending ``readonly``, which such a profile fixes).

Rows beyond the limit are not read (``result_overflow_mode = 'break'``); the result says it
was cut. ``Float32`` values come out as ClickHouse prints them: the shortest decimal that reads
back as the same 32-bit float (``0.016``, not the ``0.01600000075995922`` of its 64-bit widening).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adhoc.errors import AdhocError
from adhoc.guard import Checked, Refused, check
from storage.clickhouse import connect, parse_url

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Limits", "QueryFailed", "ReadOnlyRunner", "Refused", "Result", "TableInfo"]

MAX_SESSIONS = 8  # sessions kept per runner, one per limit set in use
_FLOAT32 = re.compile(r"^(?:(?:Nullable|LowCardinality|Array)\()*Float32\)*$")


def _short32(value: Any, f32: Any) -> Any:
    """A Float32 cell (or an array of them) as the float64 nearest its shortest decimal."""
    if isinstance(value, float):
        return float(str(f32(value))) if math.isfinite(value) else value
    if isinstance(value, list | tuple):
        return type(value)(_short32(v, f32) for v in value)
    return value


def shortest_floats(types: list[str], rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``rows`` with their ``Float32`` columns read as ClickHouse prints them."""
    narrow = [i for i, t in enumerate(types) if _FLOAT32.match(t)]
    if not narrow or not rows:
        return rows
    from numpy import float32  # once per result, not per cell

    out = []
    for row in rows:
        cells = list(row)
        for i in narrow:
            cells[i] = _short32(cells[i], float32)
        out.append(tuple(cells))
    return out


class QueryFailed(AdhocError, RuntimeError):
    """ClickHouse refused or failed the query (its first line, without the stack)."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    max_rows: int = 10_000
    max_memory_bytes: int = 2 * 1024**3

    def settings(self, readonly: bool = True) -> dict[str, Any]:
        # readonly last: on a server the HTTP parameters are applied in order
        out: dict[str, Any] = {
            "max_execution_time": max(1, round(self.timeout_s)),
            "max_result_rows": self.max_rows + 1,
            "result_overflow_mode": "break",
            "max_memory_usage": self.max_memory_bytes,
            "max_ast_elements": 100_000,
        }
        if readonly:
            out["readonly"] = 1
        return out


@dataclass
class Result:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    elapsed_s: float
    kind: str = "select"

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)


@dataclass
class TableInfo:
    name: str
    engine: str
    comment: str
    rows: int | None
    columns: list[tuple[str, str, str]] = field(default_factory=list)  # name, type, comment


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            # clickhouse-connect repeats "Code: N. DB::Exception: " prefixes; keep ClickHouse's sentence
            while "DB::Exception: " in line:
                line = line.split("DB::Exception: ", 1)[1]
            return line[:500]
    return type(exc).__name__


class ReadOnlyRunner:
    """Runs checked queries read-only against one store; thread-safe (one session per limit set)."""

    def __init__(
        self,
        url: str,
        *,
        database: str | None = None,
        limits: Limits | None = None,
        connect_timeout_s: float = 10,
        server_enforces_readonly: bool = False,
    ) -> None:
        self.url = url
        # a server user whose settings profile fixes readonly (docs/operations.md): it is not sent
        self.server_enforces_readonly = server_enforces_readonly
        self.target = parse_url(url)
        self.database = database or self.target.database or "default"
        self.limits = limits or Limits()
        self.connect_timeout_s = connect_timeout_s
        self._clients: OrderedDict[Limits, Any] = OrderedDict()  # a few sessions, the least used closed
        self._lock = threading.Lock()

    def _client(self, limits: Limits) -> Any:
        with self._lock:
            client = self._clients.get(limits)
            if client is not None:
                self._clients.move_to_end(limits)
            else:
                while len(self._clients) >= MAX_SESSIONS:
                    _, old = self._clients.popitem(last=False)
                    _close(old)
                if self.target.kind == "chdb":
                    client = connect(self.url, database=self.database)
                    for name, value in limits.settings().items():  # readonly = 1 comes last, then nothing changes
                        client.command(f"SET {name} = {value!r}" if isinstance(value, str) else f"SET {name} = {value}")
                else:
                    client = connect(
                        self.url,
                        database=self.database,
                        connect_timeout_s=self.connect_timeout_s,
                        query_timeout_s=limits.timeout_s + 10,
                    )
                self._clients[limits] = client
            return client

    def limits_for(self, max_rows: int | None = None, timeout_s: float | None = None) -> Limits:
        """The runner's limits, lowered (never raised) by a caller's own (whole seconds)."""
        rows = self.limits.max_rows if max_rows is None else max(1, min(int(max_rows), self.limits.max_rows))
        timeout = self.limits.timeout_s if timeout_s is None else max(1, min(round(timeout_s), self.limits.timeout_s))
        return Limits(float(timeout), rows, self.limits.max_memory_bytes)

    def run(self, sql: str, *, max_rows: int | None = None, timeout_s: float | None = None) -> Result:
        checked: Checked = check(sql, self.database)
        return self._run(checked.sql, checked.kind, self.limits_for(max_rows, timeout_s))

    def _run(self, sql: str, kind: str, limits: Limits) -> Result:
        client = self._client(limits)
        began = time.perf_counter()
        try:
            settings = None if self.target.kind == "chdb" else limits.settings(not self.server_enforces_readonly)
            answer = client.query(sql, settings=settings)
        except Exception as exc:  # noqa: BLE001 - ClickHouse's refusal, timeout, memory limit, bad SQL: said as is
            raise QueryFailed(_first_line(exc)) from None
        elapsed = time.perf_counter() - began
        rows = [tuple(r) for r in answer.result_rows]
        truncated = len(rows) > limits.max_rows
        types = [t.name for t in answer.column_types]
        return Result(
            list(answer.column_names),
            types,
            shortest_floats(types, rows[: limits.max_rows]),
            truncated,
            elapsed,
            kind,
        )

    def schema(self) -> list[TableInfo]:
        """The store's tables and views with their columns (types and comments)."""
        # fixed queries, this database only (users' own queries may not read system.tables/columns)
        limits = self.limits_for(10_000)
        tables = self._run(
            "SELECT name, engine, comment, total_rows FROM system.tables WHERE database = currentDatabase() "
            "AND NOT startsWith(name, '.inner') ORDER BY name",
            "select",
            limits,
        )
        columns = self._run(
            "SELECT table, name, type, comment FROM system.columns WHERE database = currentDatabase() "
            "ORDER BY table, position",
            "select",
            limits,
        )
        by_table: dict[str, list[tuple[str, str, str]]] = {}
        for table, name, kind, comment in columns.rows:
            by_table.setdefault(table, []).append((name, kind, comment))
        return [
            TableInfo(name, engine, comment, None if total is None else int(total), by_table.get(name, []))
            for name, engine, comment, total in tables.rows
        ]

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                _close(client)
            self._clients.clear()


def _close(client: Any) -> None:
    with contextlib.suppress(Exception):  # closing is best effort
        client.close()
