"""Wiring of ad-hoc SQL: ``Settings`` -> the read-only runner, the endpoint on the collector's HTTP
server, and the client side ``fleetscope sql`` uses when another process holds the store.

In:  settings (``clickhouse.url``, ``sql``, ``collector.listen_host`` / ``otlp_http_port``).
Out: ``runner(settings)``; ``mount_endpoint(settings, collector)`` (serves ``/api/v1/query`` on
     the collector's server, or says why not); ``remote_query(url, token, sql, ...)`` -> the
     same ``Result`` as a local run, from a running process's endpoint.
"""

from __future__ import annotations

from typing import Any

from adhoc.runner import Limits, QueryFailed, ReadOnlyRunner, Refused, Result
from fleetscope.settings import Settings

__all__ = ["EndpointUnavailable", "endpoint_url", "is_loopback", "mount_endpoint", "remote_query", "runner"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class EndpointUnavailable(RuntimeError):
    """The running process's query endpoint did not answer (or not as one)."""


def is_loopback(host: str) -> bool:
    return host in LOOPBACK


def limits(settings: Settings) -> Limits:
    return Limits(settings.sql.timeout_s, settings.sql.max_rows, settings.sql.max_memory_bytes)


def runner(settings: Settings) -> ReadOnlyRunner:
    ch = settings.clickhouse
    return ReadOnlyRunner(ch.url, limits=limits(settings), connect_timeout_s=ch.connect_timeout_s)


def endpoint_url(settings: Settings) -> str:
    if settings.sql.endpoint:
        return settings.sql.endpoint.rstrip("/")
    host = settings.collector.listen_host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{settings.collector.otlp_http_port}"


def mount_endpoint(settings: Settings, collector: Any) -> str:
    """Serve the query endpoint on the collector's HTTP server; a line saying where, or why not."""
    from adhoc.endpoint import QUERY_PATH, routes

    token = settings.sql.token.get_secret_value() if settings.sql.token else None
    host = settings.collector.listen_host
    if not is_loopback(host) and not token:
        return (f"SQL endpoint not served: the collector listens on {host}, beyond loopback, and no sql.token is set "
                "(FLEETSCOPE_SQL_TOKEN)")
    shared = runner(settings)
    collector.mounts.append(lambda app: routes(app, shared, token))
    return f"read-only SQL at {endpoint_url(settings)}{QUERY_PATH}" + (" (token required)" if token else "")


def remote_query(url: str, token: str | None, sql: str, *, max_rows: int | None = None,
                 timeout_s: float | None = None) -> Result:
    """Run ``sql`` through a running process's endpoint; the same errors as a local run."""
    import httpx

    from adhoc.endpoint import QUERY_PATH

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"sql": sql, "max_rows": max_rows, "timeout_s": timeout_s}
    try:
        response = httpx.post(f"{url}{QUERY_PATH}", json=body, headers=headers, timeout=(timeout_s or 30) + 15)
    except httpx.HTTPError as exc:
        raise EndpointUnavailable(f"its query endpoint {url}{QUERY_PATH} did not answer ({type(exc).__name__}: {exc})") from None
    try:
        data = response.json()
    except ValueError:
        raise EndpointUnavailable(f"{url}{QUERY_PATH} answered HTTP {response.status_code}, not fleetscope's JSON") from None
    if response.status_code == 401:
        raise EndpointUnavailable(f"{url} wants a token: set sql.token (FLEETSCOPE_SQL_TOKEN) to the one it was given")
    if response.status_code == 400:
        raise Refused(str(data.get("error", "")).removeprefix("refused: "))
    if response.status_code != 200:
        raise QueryFailed(str(data.get("error", f"HTTP {response.status_code}")))
    return Result([c["name"] for c in data["columns"]], [c["type"] for c in data["columns"]],
                  [tuple(r) for r in data["rows"]], bool(data["truncated"]), float(data["elapsed_s"]),
                  data.get("kind", "select"))
