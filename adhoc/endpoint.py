"""The read-only query endpoint: HTTP JSON in, JSON out, on the process that holds the store.

In:  ``POST /api/v1/query`` with ``{"sql": "...", "max_rows": 1000, "timeout_s": 30}``;
     ``GET /api/v1/schema``; with a token configured, ``Authorization: Bearer <token>``.
Out: ``200 {"columns": [{"name", "type"}], "rows": [[...]], "row_count", "truncated",
     "elapsed_s", "kind"}``; ``400 {"error": "..."}`` for a refused statement or bad request;
     ``422 {"error": "..."}`` when ClickHouse refused or failed the query (timeout, memory,
     unknown column); ``401`` without the right token (``403`` for a foreign ``Host`` when no
     token is configured); ``413`` for a body over 1 MiB; ``415`` unless it is JSON.
     ``GET /api/v1/schema`` answers ``{"tables": [{"name", "engine", "comment", "rows",
     "columns": [{"name", "type", "comment"}]}]}``.

``routes(app, runner, token)`` adds these to any aiohttp application (the collector's HTTP
server serves them next to OTLP: ``fleetscope collect`` holds the chDB store, so
``fleetscope sql`` reaches it here); ``fleetscope sql --serve`` runs them alone. Queries run in a
worker thread, so a slow one does not stop the server. Notebooks can use it too::

    requests.post("http://127.0.0.1:4318/api/v1/query", json={"sql": "SELECT 1"}).json()
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging

from aiohttp import web

from adhoc.formats import jsonable
from adhoc.runner import QueryFailed, ReadOnlyRunner, Refused, Result, TableInfo

__all__ = ["MAX_BODY", "QUERY_PATH", "SCHEMA_PATH", "routes"]

log = logging.getLogger(__name__)
QUERY_PATH = "/api/v1/query"
SCHEMA_PATH = "/api/v1/schema"
MAX_BODY = 1024 * 1024


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def _allowed(request: web.Request, token: str | None, known: set[str]) -> bool:
    """With a token, whether the request bears it; without, whether its ``Host`` is one of ``known``."""
    if not token:
        host = (request.host or "").lower()
        name = host[1:].split("]")[0] if host.startswith("[") else host.rsplit(":", 1)[0]
        return name in known
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def _refused_auth(token: str | None) -> web.Response:
    if not token:
        return _error(403, "this endpoint answers requests addressed to this machine's loopback name only")
    return _error(
        401,
        "this endpoint needs a token: send Authorization: Bearer <sql.token>",
        **{"WWW-Authenticate": 'Bearer realm="fleetscope"'},
    )


async def _read_query(request: web.Request) -> tuple[str, int | None, float | None] | web.Response:
    """The query's (sql, max_rows, timeout_s) from the request's JSON body, or the error response."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return _error(413, f"the request body is over {MAX_BODY:,} bytes")
    if request.content_type != "application/json":
        return _error(415, 'send the query as application/json: {"sql": "SELECT ..."}')
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _error(400, 'the body must be JSON: {"sql": "SELECT ...", "max_rows": 1000, "timeout_s": 30}')
    if not isinstance(body, dict) or not isinstance(body.get("sql"), str):
        return _error(400, 'the body must be a JSON object with "sql" (a string)')
    try:
        max_rows = None if body.get("max_rows") is None else int(body["max_rows"])
        timeout_s = None if body.get("timeout_s") is None else float(body["timeout_s"])
    except (TypeError, ValueError, OverflowError):
        return _error(400, "max_rows and timeout_s must be finite numbers")
    return body["sql"], max_rows, timeout_s


def _result_json(result: Result) -> web.Response:
    return web.json_response(
        {
            "columns": [{"name": n, "type": t} for n, t in zip(result.columns, result.types, strict=True)],
            "rows": [[jsonable(v) for v in row] for row in result.rows],
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "elapsed_s": round(result.elapsed_s, 6),
            "kind": result.kind,
        }
    )


def _schema_json(tables: list[TableInfo]) -> web.Response:
    return web.json_response(
        {
            "tables": [
                {
                    "name": t.name,
                    "engine": t.engine,
                    "comment": t.comment,
                    "rows": t.rows,
                    "columns": [{"name": c, "type": k, "comment": m} for c, k, m in t.columns],
                }
                for t in tables
            ]
        }
    )


def routes(app: web.Application, runner: ReadOnlyRunner, token: str | None, *, hosts: tuple[str, ...] = ()) -> None:
    """Serve the query and schema endpoints on ``app`` (with ``token``: only to its bearer).

    Without a token (loopback only) a request must name a loopback host (or one of ``hosts``) in
    its ``Host`` header, so a web page cannot reach it through DNS rebinding; and queries must be
    sent as ``application/json``, which a cross-site form cannot do without asking first."""
    known = {h.lower() for h in (*LOOPBACK_NAMES, *hosts)}

    async def query(request: web.Request) -> web.Response:
        if not _allowed(request, token, known):
            return _refused_auth(token)
        asked = await _read_query(request)
        if isinstance(asked, web.Response):
            return asked
        sql, max_rows, timeout_s = asked
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, lambda: runner.run(sql, max_rows=max_rows, timeout_s=timeout_s))
        except Refused as exc:
            return _error(400, f"refused: {exc}")
        except QueryFailed as exc:
            return _error(422, str(exc))
        return _result_json(result)

    async def schema(request: web.Request) -> web.Response:
        if not _allowed(request, token, known):
            return _refused_auth(token)
        loop = asyncio.get_running_loop()
        try:
            tables = await loop.run_in_executor(None, runner.schema)
        except (Refused, QueryFailed) as exc:
            return _error(422, str(exc))
        return _schema_json(tables)

    app.router.add_post(QUERY_PATH, query)
    app.router.add_get(SCHEMA_PATH, schema)
