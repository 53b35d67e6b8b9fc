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
from fleetscope.errors import EndpointUnavailable
from fleetscope.settings import Settings

__all__ = [
    "endpoint_url",
    "is_loopback",
    "mount_endpoint",
    "remote_query",
    "remote_schema",
    "runner",
]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK


def limits(settings: Settings) -> Limits:
    return settings.sql.limits()


def runner(settings: Settings) -> ReadOnlyRunner:
    ch = settings.clickhouse
    return ReadOnlyRunner(
        ch.url,
        limits=limits(settings),
        connect_timeout_s=ch.connect_timeout_s,
        server_enforces_readonly=settings.sql.server_enforces_readonly,
    )


def endpoint_url(settings: Settings) -> str:
    if settings.sql.endpoint:
        return settings.sql.endpoint.rstrip("/")
    host = settings.collector.listen_host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    return f"http://{host}:{settings.collector.otlp_http_port}"


def mount_endpoint(settings: Settings, collector: Any) -> str:
    """Serve the query endpoint on the collector's HTTP server; a line saying where, or why not."""
    from adhoc.endpoint import QUERY_PATH, routes

    token = settings.sql.token.get_secret_value() if settings.sql.token else None
    host = settings.collector.listen_host
    if not is_loopback(host) and not token:
        return (
            f"SQL endpoint not served: the collector listens on {host}, beyond loopback, and no sql.token is set "
            "(FLEETSCOPE_SQL_TOKEN)"
        )
    shared = runner(settings)
    collector.mounts.append(lambda app: routes(app, shared, token, hosts=(host,)))
    return f"read-only SQL at {endpoint_url(settings)}{QUERY_PATH}" + (" (token required)" if token else "")


def _post_or_get(url: str, token: str | None, path: str, body: dict[str, Any] | None, timeout_s: float) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        if body is None:
            response = httpx.get(f"{url}{path}", headers=headers, timeout=timeout_s)
        else:
            response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EndpointUnavailable(
            f"its query endpoint {url}{path} did not answer ({type(exc).__name__}: {exc})"
        ) from None
    try:
        data = response.json()
    except ValueError:
        raise EndpointUnavailable(f"{url}{path} answered HTTP {response.status_code}, not fleetscope's JSON") from None
    if response.status_code == 401:
        raise EndpointUnavailable(f"{url} wants a token: set sql.token (FLEETSCOPE_SQL_TOKEN) to the one it was given")
    if response.status_code == 400:
        raise Refused(str(data.get("error", "")).removeprefix("refused: "))
    if response.status_code != 200:
        raise QueryFailed(str(data.get("error", f"HTTP {response.status_code}")))
    return data


def remote_schema(url: str, token: str | None) -> Result:
    """The schema from a running process's endpoint, as rows (table, column, type, comment)."""
    from adhoc.endpoint import SCHEMA_PATH

    data = _post_or_get(url, token, SCHEMA_PATH, None, 30)
    rows = [(t["name"], c["name"], c["type"], c["comment"]) for t in data["tables"] for c in t["columns"]]
    return Result(["table", "column", "type", "comment"], ["String"] * 4, rows, False, 0.0, "select")


def remote_query(
    url: str, token: str | None, sql: str, *, max_rows: int | None = None, timeout_s: float | None = None
) -> Result:
    """Run ``sql`` through a running process's endpoint; the same errors as a local run, and the
    values as JSON carries them (times as ISO 8601 text)."""
    from adhoc.endpoint import QUERY_PATH

    body = {"sql": sql, "max_rows": max_rows, "timeout_s": timeout_s}
    data = _post_or_get(url, token, QUERY_PATH, body, (timeout_s or 30) + 15)
    return Result(
        [c["name"] for c in data["columns"]],
        [c["type"] for c in data["columns"]],
        [tuple(r) for r in data["rows"]],
        bool(data["truncated"]),
        float(data["elapsed_s"]),
        data.get("kind", "select"),
    )
