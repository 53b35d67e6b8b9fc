"""``fleetscope explain``: the Investigate page's explanation, in the terminal.

In:  a metric (a latency: ttft, itl, tpot, e2e, queue, with a percentile; ``cost``: cost per
     1M tokens, with GPU prices from the metadata DB; or a quality rate of the answers the gateway
     scored: ``truncation``, ``refusal``, ``empty``), a window (``--since`` back from now, or
     ``--start``/``--end``), filters (for cost: one tenant, model or route, or none for the
     fleet; for a quality rate: the rows read, any number of tenants, models, routes), settings
     (the stores).
Out: on stdout the sentence, the break (before → after, when it began) and the evidence ranked
     (for cost: the decomposition of the change, the tenants whose requests changed pool and the
     router's reasons; for a quality rate: the tenants, models (adapters), routes and reasons
     holding the rise, the max_tokens of the group that rose and its model mix), as text or JSON
     (``--format json``: for scripts and tests; the cost and quality documents' keys are in
     docs/analytics.md). Exit codes: 0 an explanation or a clear "no break found", 1 the store is
     unreachable or held by another process, 2 bad options.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from common.timeutil import as_utc
from fleetscope.cliutil import ConfigOption, fail, settings_or_exit

EXAMPLES = """Examples:
  fleetscope explain                                 # p99 TTFT over the last hour
  fleetscope explain --latency itl --q 0.95 --since 6h --model tiny-small
  fleetscope explain --metric cost --tenant globex   # why a tenant's cost per 1M tokens rose
  fleetscope explain --metric cost --at 2026-11-30T09:40 --since 2h   # what changed at a deploy
  fleetscope explain --metric truncation --since 30m  # why more answers stop at max_tokens
  fleetscope explain --metric refusal --tenant initech --format json
  fleetscope explain --start 2026-11-30T09:00 --end 2026-11-30T10:30 --format json"""


def _when(value: str, option: str) -> datetime:
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{option} {value!r} is not a time: write e.g. 2026-11-30T09:00 (UTC unless an offset is given)", code=2)
    return as_utc(t)


def window(since: str, start: str | None, end: str | None, now: datetime | None = None) -> tuple[datetime, datetime]:
    """``[start, end)`` from the options: ``--start`` (and ``--end``, default now) or ``--since`` back from the end."""
    from common.durations import parse_duration

    stop = _when(end, "--end") if end else (now or datetime.now(UTC))
    if start:
        begin = _when(start, "--start")
    else:
        try:
            begin = stop - timedelta(seconds=parse_duration(since))
        except ValueError as exc:
            fail(f"--since: {exc}", code=2)
    if begin >= stop:
        fail(f"the window is empty: {begin:%Y-%m-%d %H:%M:%S} is not before {stop:%Y-%m-%d %H:%M:%S} UTC", code=2)
    return begin, stop


def _plain(value: Any) -> Any:
    import pandas as pd

    if value is None or (not isinstance(value, str | list | dict) and pd.isna(value)):
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if hasattr(value, "to_pydatetime"):
        return value.to_pydatetime().astimezone(UTC).isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return value


def as_json(ex: Any, start: datetime, end: datetime) -> dict[str, Any]:
    """The explanation as JSON-ready data: what the text output shows, and every evidence row."""
    rows = [{k: _plain(v) for k, v in row.items()} for row in ex.evidence.to_dict("records")]
    return {
        "metric": ex.metric,
        "source": ex.source,
        "start": _plain(start),
        "end": _plain(end),
        "step_s": ex.step,
        "break_at": _plain(ex.break_at),
        "onset": _plain(ex.onset),
        "before_s": _plain(ex.before),
        "after_s": _plain(ex.after),
        "sentence": ex.sentence,
        "notes": list(ex.notes),
        "evidence": rows,
    }


def _table(ex: Any) -> str:
    rows = ex.evidence.to_dict("records")
    if not rows:
        return "no evidence: no signal moved with the latency"
    shown = []
    for r in rows:
        lead = r.get("lead_s")
        shown.append(
            [
                str(r["signal"]),
                f"{r['score']:.2f}",
                _number(r["before"]),
                _number(r["after"]),
                "–" if lead is None or (isinstance(lead, float) and math.isnan(lead)) else f"{lead:.0f}s",
                str(r.get("detail") or ""),
            ]
        )
    head = ["signal", "score", "before", "after", "lead", "detail"]
    widths = [max(len(head[i]), *(len(s[i]) for s in shown)) for i in range(len(head) - 1)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, [*widths, 0], strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(s, [*widths, 0], strict=True)).rstrip() for s in shown]
    return "\n".join(lines)


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


QUALITY = ("truncation", "refusal", "empty")  # the quality rates --metric takes


def _checked(metric: str | None, latency: str, fmt: str, at: str | None, latencies: Any) -> str:
    """The latency explained (``--metric`` names it when it is one), after the options' checks (exit 2)."""
    if metric is not None and metric != "cost" and metric not in QUALITY and metric not in latencies:
        fail(f"--metric must be cost, {', '.join(QUALITY)} or one of {', '.join(latencies)}, not {metric!r}", code=2)
    if metric is not None and metric != "cost" and metric not in QUALITY:
        latency = metric
    if metric != "cost" and metric not in QUALITY and latency not in latencies:
        fail(f"--latency must be one of {', '.join(latencies)}, not {latency!r}", code=2)
    if fmt not in ("text", "json"):
        fail(f"--format must be text or json, not {fmt!r}", code=2)
    if at is not None and metric != "cost":
        fail("--at is for --metric cost (a latency's or a quality rate's break is always found)", code=2)
    return latency


def explain_command(
    latency: Annotated[str, typer.Option(help="ttft, itl, tpot, e2e or queue.")] = "ttft",
    metric: Annotated[
        str | None,
        typer.Option(
            help="What to explain: cost (per 1M tokens), a quality rate (truncation, refusal, empty), "
            "or a latency (as --latency)."
        ),
    ] = None,
    q: Annotated[float, typer.Option("--q", min=0.01, max=0.999, help="The percentile, as a fraction.")] = 0.99,
    since: Annotated[str, typer.Option(help="The window: this far back from --end (e.g. 30m, 6h).")] = "1h",
    start: Annotated[str | None, typer.Option(help="The window's start (ISO time, UTC); instead of --since.")] = None,
    end: Annotated[str | None, typer.Option(help="The window's end (ISO time, UTC; default now).")] = None,
    model: Annotated[list[str] | None, typer.Option(help="Only this model (repeat for several).")] = None,
    replica: Annotated[list[str] | None, typer.Option(help="Only this replica (repeat for several).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(help="Only this tenant (repeat for several).")] = None,
    route: Annotated[list[str] | None, typer.Option(help="Only this route (repeat for several).")] = None,
    at: Annotated[
        str | None,
        typer.Option(
            help="With --metric cost: compare before and after this time (ISO, UTC; e.g. a deploy) "
            "instead of finding the break."
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    config: ConfigOption = None,
) -> None:
    """Explain a latency regression, a rise in cost per 1M tokens (--metric cost) or in a quality rate
    (--metric truncation, refusal, empty): when it broke, by how much, and the evidence ranked
    (KV-cache saturation, queueing, long-context share, tenant or model mix, ...; for cost, the change
    split into the view's own traffic, each pool's volume and spend, with the tenants the router
    moved; for quality, the tenant, model or route holding the rise, its max_tokens and model mix;
    a latency held flat by the gateway's shedding: that shedding), as the Investigate page shows it."""
    from analytics.explain import explain
    from analytics.filters import Filters
    from analytics.latency import LATENCIES
    from fleetscope.stores import open_clickhouse
    from storage.errors import StoreError

    latency = _checked(metric, latency, fmt, at, LATENCIES)
    when = _when(at, "--at") if at is not None else None
    settings = settings_or_exit(config)
    begin, stop = window(since, start, end)
    if when is not None and not begin < when < stop:
        fail(f"--at {when:%Y-%m-%d %H:%M:%S} is not inside the window ({begin:%H:%M:%S} – {stop:%H:%M:%S} UTC)", code=2)
    try:
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    if metric in ("cost", *QUALITY):
        try:
            if metric == "cost":
                _explain_cost(settings, client, begin, stop, Filters(model, replica, tenant, route), fmt, when)
            else:
                prices = _prices(settings, required=False)
                _explain_quality(client, begin, stop, metric, Filters(model, replica, tenant, route), fmt, prices)
        finally:
            client.close()
        return
    try:
        ex = explain(client, begin, stop, latency=latency, q=q, filters=Filters(model, replica, tenant, route))
    finally:
        client.close()
    if fmt == "json":
        typer.echo(json.dumps(as_json(ex, begin, stop), indent=2))
        return
    typer.echo(f"{ex.metric}, {begin:%Y-%m-%d %H:%M:%S} – {stop:%H:%M:%S} UTC, from the {ex.source}")
    typer.echo(ex.sentence)
    for note in ex.notes:
        typer.echo(f"note: {note}")
    if ex.break_at is None:
        if len(ex.evidence):  # no rise, held by the gateway's shedding: its row
            typer.echo("\n" + _table(ex))
        return
    onset = f", onset {ex.onset:%H:%M:%S}" if ex.onset is not None else ""
    typer.echo(
        f"break at {ex.break_at:%H:%M:%S} UTC{onset}: {ex.before:.3f} s → {ex.after:.3f} s "
        f"({ex.after / ex.before:.1f}×)\n"
    )
    typer.echo(_table(ex))


def _prices(settings: Any, *, required: bool) -> dict[str, float]:
    """The GPU prices of the metadata DB; unreadable: exit 1 (``required``) or none (the quality
    explanation then leaves cost out)."""
    from sqlalchemy.exc import SQLAlchemyError

    from storage.catalog import gpu_prices
    from storage.metadata import make_engine, make_sessionmaker

    try:
        return gpu_prices(make_sessionmaker(make_engine(settings.metadata.url)))
    except SQLAlchemyError as exc:
        if not required:
            return {}
        fail(
            f"the GPU prices cannot be read from the metadata DB ({str(exc).splitlines()[0][:200]}): "
            "run `fleetscope migrate`"
        )


def _explain_cost(
    settings: Any, client: Any, begin: datetime, stop: datetime, filters: Any, fmt: str, at: datetime | None
) -> None:

    from analytics.explain import explain_cost

    prices = _prices(settings, required=True)
    try:
        ex = explain_cost(client, begin, stop, prices, filters=filters, weights=settings.cost.weights(), at=at)
    except ValueError as exc:
        fail(str(exc), code=2)
    except KeyError as exc:
        fail(f"{exc.args[0]} (fleetscope prices list)")
    if fmt == "json":
        typer.echo(json.dumps({"start": _plain(begin), "end": _plain(stop), **ex.to_dict()}, indent=2))
        return
    typer.echo(
        f"cost per 1M tokens of {ex.view}, {begin:%Y-%m-%d %H:%M:%S} – {stop:%H:%M:%S} UTC, from the {ex.source}"
    )
    typer.echo(ex.sentence)
    for problem in ex.problems:
        typer.echo(f"note: {problem}")
    if ex.break_at is None or ex.decomposition.empty:
        return
    typer.echo(
        f"break at {ex.break_at:%H:%M:%S} UTC: ${ex.before:,.4g} → ${ex.after:,.4g} per 1M tokens "
        f"({ex.after / ex.before:.2f}×)\n"
        if ex.before > 0
        else ""
    )
    rows = [
        [str(r.kind), str(r.pool or "–"), f"{r.usd_per_million:+.4g}", f"{r.share:.0%}", str(r.detail)]
        for r in ex.evidence.itertuples()
    ]
    head = ["driver", "pool", "$/1M", "share", "detail"]
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head) - 1)]
    typer.echo("  ".join(h.ljust(w) for h, w in zip(head, [*widths, 0], strict=True)).rstrip())
    for row in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, [*widths, 0], strict=True)).rstrip())
    for m in ex.movers.head(3).itertuples():
        typer.echo(
            f"moved: tenant {m.tenant} to {m.to_pool} ({m.share_before:.0%} → {m.share_after:.0%} of its tokens)"
            + (f", routed by {m.route!s}: {m.example!s}" if m.example else "")
        )


def _clock(t: Any) -> str:
    import pandas as pd

    return "–" if t is None or t is pd.NaT or (isinstance(t, float) and math.isnan(t)) else f"{t:%H:%M:%S}"


def _explain_quality(
    client: Any, begin: datetime, stop: datetime, rate: str, filters: Any, fmt: str, prices: dict[str, float]
) -> None:
    from analytics.explain import explain_quality

    try:
        ex = explain_quality(client, begin, stop, rate=rate, filters=filters, prices=prices)
    except ValueError as exc:
        fail(str(exc), code=2)
    if fmt == "json":
        typer.echo(json.dumps({"start": _plain(begin), "end": _plain(stop), **ex.to_dict()}, indent=2))
        return
    typer.echo(f"{ex.metric}, {begin:%Y-%m-%d %H:%M:%S} – {stop:%H:%M:%S} UTC, from the gateway's scored answers")
    typer.echo(ex.sentence)
    for note in ex.notes:
        typer.echo(f"note: {note}")
    if ex.break_at is None:
        return
    typer.echo(f"break at {ex.break_at:%H:%M:%S} UTC: {ex.before:.1%} → {ex.after:.1%} of the evaluated answers\n")
    rows = [
        [
            str(r.signal),
            f"{r.score:.2f}",
            _number(r.before),
            _number(r.after),
            _clock(r.moved_at),
            str(r.detail),
        ]
        for r in ex.evidence.itertuples()
    ]
    if not rows:
        typer.echo("no evidence: no tenant, model or route holds more of the rise than of the answers")
        return
    head = ["signal", "score", "before", "after", "moved", "detail"]
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head) - 1)]
    typer.echo("  ".join(h.ljust(w) for h, w in zip(head, [*widths, 0], strict=True)).rstrip())
    for row in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, [*widths, 0], strict=True)).rstrip())
