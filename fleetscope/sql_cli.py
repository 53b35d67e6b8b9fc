"""``fleetscope sql``: ad-hoc, read-only ClickHouse SQL on the fleet's data, from the terminal.

In:  a query (argument, ``-f FILE`` or stdin), settings (store URL, ``sql`` limits and token).
Out: the result as a table, CSV, JSON or Parquet on stdout or in ``--output``. Where it runs:
     a ClickHouse server directly; the chDB store directly when no other process holds it;
     otherwise the running process's read-only endpoint (``fleetscope up`` / ``collect``).
     ``--schema`` lists the tables and columns; ``--serve`` runs the endpoint alone.
     Exit codes: 0 ok, 1 the query failed (timeout, memory, unknown column) or the store is
     unreachable, 2 refused (not a single read-only statement) or a usage error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleetscope.cliutil import ConfigOption, fail, settings_or_exit

if TYPE_CHECKING:
    from adhoc.runner import ReadOnlyRunner, Result
    from fleetscope.settings import Settings

EXAMPLES = """Examples:
  fleetscope sql "SELECT model, count() FROM requests GROUP BY model"
  fleetscope sql -f docs/queries/p99_ttft_by_model_per_hour.sql --format csv --output ttft.csv
  echo "SELECT 1" | fleetscope sql --format json
  fleetscope sql --schema"""


def _read_query(query: str | None, file: Path | None) -> str:
    if query and file:
        fail("give the query as an argument or with -f, not both", code=2)
    if file is not None:
        try:
            return file.read_text(encoding="utf-8")
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror}", code=2)
    if query:
        return query
    if not sys.stdin.isatty():
        return sys.stdin.read()
    fail("no query: give it as an argument, with -f FILE, or on stdin\n" + EXAMPLES, code=2)


def sql(
    query: Annotated[
        str | None, typer.Argument(help="The query (ClickHouse SQL; one SELECT/DESCRIBE/SHOW/EXPLAIN).")
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the query from this file.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv, json or parquet.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Most rows to return (default and cap: sql.max_rows).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="Seconds before the query is stopped (cap: sql.timeout_s).")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Query a running fleetscope at this URL (default: only when it holds the store).")
    ] = None,
    schema: Annotated[bool, typer.Option("--schema", help="List the tables and their columns, then exit.")] = False,
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve the read-only query endpoint alone (holds the store).")
    ] = False,
    host: Annotated[
        str, typer.Option(help="With --serve: the address (a token is required beyond loopback).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="With --serve: the port.")] = 4318,
    config: ConfigOption = None,
) -> None:
    """Run read-only SQL on the fleet's data: tables samples, series, scrapes, requests and their rollups,
    alert_events (docs/schema.md; examples in docs/queries/).

    Writes, DDL, SETTINGS, several statements and functions that reach files or the network are refused;
    queries run read-only with a time, row and memory limit.
    """
    from adhoc.formats import FORMATS

    settings = settings_or_exit(config)
    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}", code=2)
    if serve:
        _serve(settings, host, port)
        return
    if fmt == "parquet" and output is None and sys.stdout.isatty():
        fail("parquet is binary: give --output FILE (or redirect stdout)", code=2)
    text = "" if schema else _read_query(query, file)
    result, data = _answer(settings, text, schema=schema, endpoint=endpoint, limit=limit, timeout=timeout, fmt=fmt)
    if output is not None:
        try:
            output.write_bytes(data)
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror}")
        typer.echo(
            f"{len(result.rows):,} row(s) written to {output}"
            + (" (cut at the row limit)" if result.truncated else ""),
            err=True,
        )
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        if result.truncated and fmt != "table":
            typer.echo(f"note: cut at the row limit ({len(result.rows):,} rows): add LIMIT or raise --limit", err=True)


def _answer(
    settings: Settings,
    text: str,
    *,
    schema: bool,
    endpoint: str | None,
    limit: int | None,
    timeout: float | None,
    fmt: str,
) -> tuple[Result, bytes]:
    """The query's result (or the schema's), from the store or a running process's endpoint, and
    that result written in ``fmt``; a failure: its line, and exit 2 (refused) or 1."""
    from adhoc.formats import render
    from adhoc.runner import QueryFailed, Refused
    from fleetscope.errors import EndpointUnavailable
    from fleetscope.queryapi import endpoint_url, runner
    from storage.errors import StoreError, StoreUnavailable

    token = settings.sql.token.get_secret_value() if settings.sql.token else None
    ask = _Ask(token, text, schema, limit, timeout)
    local = None
    try:
        if endpoint is None:
            local = runner(settings)
            try:
                result = _schema_rows(local) if schema else local.run(text, max_rows=limit, timeout_s=timeout)
            except StoreUnavailable as exc:
                if "held by another process" not in str(exc):
                    raise
                try:
                    result = ask.remote(endpoint_url(settings))
                except EndpointUnavailable as down:
                    fail(f"{exc.args[0].split(' (')[0]}, and {down}")
        else:
            result = ask.remote(endpoint.rstrip("/"))
        data = render(result, fmt)
    except Refused as exc:
        fail(f"refused: {exc}", code=2)
    except QueryFailed as exc:
        fail(f"the query failed: {exc}")
    except (StoreError, EndpointUnavailable) as exc:
        fail(str(exc))
    except (TypeError, ValueError) as exc:  # a value the format cannot hold
        fail(f"cannot write the result as {fmt}: {exc}")
    finally:
        if local is not None:
            local.close()
    return result, data


@dataclass(frozen=True)
class _Ask:
    """What to ask a running process's endpoint: the schema, or the query with its limits."""

    token: str | None
    text: str
    schema: bool
    limit: int | None
    timeout: float | None

    def remote(self, url: str) -> Result:
        from fleetscope.queryapi import remote_query, remote_schema

        if self.schema:
            return remote_schema(url, self.token)
        return remote_query(url, self.token, self.text, max_rows=self.limit, timeout_s=self.timeout)


def _schema_rows(local: ReadOnlyRunner) -> Result:
    from adhoc.runner import Result

    rows = [(t.name, c, k, m) for t in local.schema() for c, k, m in t.columns]
    return Result(["table", "column", "type", "comment"], ["String"] * 4, rows, False, 0.0, "select")


def _serve(settings: Settings, host: str, port: int) -> None:
    import asyncio
    import signal

    from aiohttp import web

    from adhoc.endpoint import QUERY_PATH, routes
    from fleetscope.queryapi import is_loopback, runner

    token = settings.sql.token.get_secret_value() if settings.sql.token else None
    if not is_loopback(host) and not token:
        fail(
            f"refusing to serve SQL on {host} without a token: set sql.token (FLEETSCOPE_SQL_TOKEN), or keep it on "
            "127.0.0.1",
            code=2,
        )
    shared = runner(settings)

    async def main() -> None:
        app = web.Application(client_max_size=1024 * 1024)
        routes(app, shared, token, hosts=(host,))
        web_runner = web.AppRunner(app, access_log=None)
        await web_runner.setup()
        await web.TCPSite(web_runner, host, port).start()
        typer.echo(
            f"read-only SQL at http://{host}:{port}{QUERY_PATH}"
            + (" (token required)" if token else "")
            + "; Ctrl-C stops it",
            err=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await web_runner.cleanup()

    try:
        asyncio.run(main())
    except OSError as exc:
        fail(f"cannot serve on {host}:{port}: {exc.strerror}")
    finally:
        shared.close()
