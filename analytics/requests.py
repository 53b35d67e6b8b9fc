"""Request-log queries on the tier that fits the window: weighted totals and latency / size
quantiles, grouped by request dimensions.

In:  a client, a window ``[start, end)``, ``by`` (a list of: model, tenant, route, outcome,
     finish_reason, context_bucket, source; ``replica`` on the raw tier only), the row ``source`` (``gateway``: the
     gateway's log, which knows tenants; ``otlp``: engine spans; ``None``: both), and
     optionally ``filters`` (``analytics.filters.Filters``) and a forced tier / retention /
     current time (``analytics.tiers.plan``).
Out: DataFrames, one row per group, with ``.attrs["plan"]``:
     - ``request_totals``: ``rows`` (sampled rows), ``requests`` (sum of weights: the estimated
       number of requests), weighted ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``;
     - ``request_quantiles``: ``{field}_q{level}`` columns for several fields and levels in one
       query (e.g. the distributions drift compares);
     - ``request_quantile``: ``value``, the ``q`` quantile of a field (``ttft``, ``e2e``,
       ``tpot``, ``itl``, ``queue``, ``prompt_tokens``, ``completion_tokens``, ``max_tokens``),
       weighted by round(weight). Raw rows give the exact weighted quantile; rollups merge
       t-digest sketches (tests state the tolerance: within the exact q +/- 0.05 quantiles).
       Latencies of 0 (no token was produced) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import pandas as pd
from typing_extensions import Unpack

from analytics.errors import BadInput
from analytics.filters import Filters, request_rows
from analytics.frames import arrow_df, query_df, sort_by
from analytics.tiers import Plan, align, between, param_time, plan_scope
from analytics.vllm import LATENCIES
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = [
    "CONTEXT_BUCKET",
    "DIMENSIONS",
    "FIELDS",
    "SERVER_ERRORS",
    "error_ratio",
    "log_source",
    "prefer_source",
    "request_quantile",
    "request_quantiles",
    "request_totals",
]

CONTEXT_BUCKET = (
    "multiIf(prompt_tokens < 2048, '<2k', prompt_tokens < 8192, '2-8k', prompt_tokens < 32768, '8-32k', '>32k')"
)
DIMENSIONS = ("model", "tenant", "route", "outcome", "finish_reason", "context_bucket", "source")
RAW_ONLY = ("replica",)  # kept per row, not in the rollups (per-replica latency: analytics.metrics)
# field -> (raw column, rollup sketch column, is a latency)
FIELDS = {
    **{name: (latency.column, latency.sketch, True) for name, latency in LATENCIES.items()},
    "prompt_tokens": ("prompt_tokens", "prompt_tokens_q", False),
    "completion_tokens": ("completion_tokens", "completion_tokens_q", False),
    "max_tokens": ("max_tokens", "max_tokens_q", False),
}


def prefer_source(sources: Iterable[str]) -> str | None:
    """Which request log to read, of the ``sources`` that have rows: the gateway's (it knows
    tenants and routes, and logs the requests it refused) when it has some, else the engines'
    spans (``otlp``), else None. The same request is in both; read one, never their sum."""
    present = set(sources)
    return "gateway" if "gateway" in present else "otlp" if "otlp" in present else None


def log_source(client: Client, start: datetime, end: datetime, filters: Filters | None = None) -> str | None:
    """``prefer_source`` of the raw request log's rows in ``[start, end)`` (``filters`` applied):
    the first source in its order that has a row there (a read that stops at the first row found,
    not a scan of the window: 30 days of 2.9M rows, 39 ms for every source seen)."""
    condition, params = request_rows(None, filters)
    for source in ("gateway", "otlp"):
        found = client.query(
            f"SELECT 1 FROM requests WHERE source = {{source:String}} AND ts >= {{start:DateTime64(3)}} "
            f"AND ts < {{end:DateTime64(3)}} AND {condition} LIMIT 1",
            parameters={**params, "source": source, "start": param_time(start), "end": param_time(end)},
            # one thread, the filter read as a plain WHERE: a first row found in 4 ms instead of 7
            settings={"max_threads": 1, "optimize_move_to_prewhere": 0},
        ).result_rows
        if found:
            return prefer_source([source])
    return None


def _prepare(
    client: Client,
    start: datetime,
    end: datetime,
    by: list[str] | tuple[str, ...],
    source: str | None,
    scope: Scope,
    step: float | None = None,
) -> tuple[Plan, str, str, str, dict[str, object], int | None]:
    """The plan, table, select list, where clause, parameters and the step in effect (a rollup
    tier rounds it up to whole buckets)."""
    for dim in by:
        if dim not in DIMENSIONS + RAW_ONLY:
            raise BadInput(f"cannot group requests by {dim!r}; one of {', '.join(DIMENSIONS + RAW_ONLY)}")
    p = plan_scope(client, start, end, scope, kind="requests")
    if p.tier.rollup and any(d in RAW_ONLY for d in by):
        raise BadInput(
            f"requests are rolled up without {', '.join(RAW_ONLY)}: group by it on the raw tier "
            f"(tier='raw', windows the raw request log still holds), or use analytics.metrics"
        )
    select = ", ".join(by)
    where = between(p.tier.rollup)
    params: dict[str, object] = {"start": param_time(p.start), "end": param_time(p.end)}
    condition, extra = request_rows(source, scope.get("filters"), raw=not p.tier.rollup)
    where += f" AND {condition}"
    params.update(extra)
    # raw rows get their context bucket computed (the rollups store it)
    table = p.requests if p.tier.rollup else f"(SELECT *, {CONTEXT_BUCKET} AS context_bucket FROM {p.requests})"
    if step is not None:
        if step < 1:
            raise BadInput(f"step must be at least 1 second, got {step}")
        if p.tier.rollup:  # whole buckets of the tier
            res = int(p.tier.resolution.total_seconds())
            step = max(res, -(-int(step) // res) * res)
        # whole steps: the first and last step are complete, on the same grid as the metrics'
        p = Plan(p.tier, *align(p.start, p.end, timedelta(seconds=int(step))))
        params.update(start=param_time(p.start), end=param_time(p.end))
        select = ", ".join(
            [f"toDateTime64(toStartOfInterval(ts, INTERVAL {int(step)} SECOND), 3, 'UTC') AS step_ts", *by]
        )
    return p, table, select, where, params, (int(step) if step is not None else None)


def _keys(by: list[str] | tuple[str, ...], step: float | None) -> list[str]:
    """The columns a read groups by, in the order its rows are put in: the step, then ``by``."""
    return (["step_ts"] if step is not None else []) + list(by)


def _group(by: list[str] | tuple[str, ...], step: float | None) -> str:
    """The GROUP BY clause; the rows are put in order by ``_finish`` (an ORDER BY in the query cost
    8 ms of a 17 ms read of 30 days' hourly rows, the sort of its 7,200 rows in pandas 2.5 ms)."""
    keys = _keys(by, step)
    return f" GROUP BY {', '.join(keys)}" if keys else ""


def _finish(df: pd.DataFrame, p: Plan, step: int | None = None, by: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows in the order of their step and groups, ``ts`` as a UTC time, the plan and step as attrs."""
    keys = _keys(by, step)
    if keys and len(df) > 1:
        df = sort_by(df, keys)
    if "step_ts" in df:
        df = df.rename(columns={"step_ts": "ts"})
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df.attrs["plan"] = p
    if step is not None:
        df.attrs["step"] = step  # seconds per step, as used (whole rollup buckets)
    return df


def request_totals(
    client: Client,
    start: datetime,
    end: datetime,
    by: list[str] | tuple[str, ...] = ("model",),
    *,
    source: str | None = "gateway",
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Weighted request and token totals per group over ``[start, end)``."""
    p, table, select, where, params, step = _prepare(client, start, end, by, source, scope, step)
    if p.tier.rollup:
        measures = (
            "sum(rows) AS rows, sum(requests) AS requests, sum(prompt_tokens) AS prompt_tokens, "
            "sum(completion_tokens) AS completion_tokens, sum(cached_tokens) AS cached_tokens"
        )
    else:
        measures = (
            "count() AS rows, sum(toFloat64(weight)) AS requests, sum(weight * prompt_tokens) AS prompt_tokens, "
            "sum(weight * completion_tokens) AS completion_tokens, sum(weight * cached_tokens) AS cached_tokens"
        )
    group = _group(by, step)
    head = f"{select}, " if select else ""
    sql = f"SELECT {head}{measures} FROM {table} WHERE {where}{group}"
    return _finish(arrow_df(client, sql, parameters=params), p, step, by)


def request_quantile(
    client: Client,
    field: str,
    q: float,
    start: datetime,
    end: datetime,
    by: list[str] | tuple[str, ...] = ("model",),
    *,
    source: str | None = "gateway",
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """The weighted ``q`` quantile of ``field`` per group over ``[start, end)``."""
    if field not in FIELDS:
        raise BadInput(f"unknown request field {field!r}; one of {', '.join(FIELDS)}")
    if not 0 <= q <= 1:
        raise BadInput(f"quantile must be within [0, 1], got {q}")
    p, table, select, where, params, step = _prepare(client, start, end, by, source, scope, step)
    column, sketch, latency = FIELDS[field]
    if p.tier.rollup:
        measure = f"quantileTDigestWeightedMerge({q!r})({sketch}) AS value"
    else:
        measure = f"quantileExactWeighted({q!r})({column}, toUInt64(greatest(1, round(weight)))) AS value"
        if latency:
            where += f" AND {column} > 0"
    group = _group(by, step)
    head = f"{select}, " if select else ""
    sql = f"SELECT {head}{measure} FROM {table} WHERE {where}{group}"
    return _finish(query_df(client, sql, parameters=params), p, step, by)


def request_quantiles(
    client: Client,
    fields: list[str] | tuple[str, ...],
    levels: list[float] | tuple[float, ...],
    start: datetime,
    end: datetime,
    by: list[str] | tuple[str, ...] = ("model",),
    *,
    source: str | None = "gateway",
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Weighted quantiles of several ``fields`` at several ``levels`` per group, in one query:
    columns ``{field}_q{level}`` (e.g. ``prompt_tokens_q0.9``)."""
    for field in fields:
        if field not in FIELDS:
            raise BadInput(f"unknown request field {field!r}; one of {', '.join(FIELDS)}")
    if not levels or not all(0 <= q <= 1 for q in levels):
        raise BadInput(f"quantile levels must be within [0, 1], got {levels}")
    p, table, select, where, params, step = _prepare(client, start, end, by, source, scope, step)
    qs = ", ".join(repr(float(q)) for q in levels)
    measures = []
    for field in fields:
        column, sketch, latency = FIELDS[field]
        if p.tier.rollup:
            measures.append(f"quantilesTDigestWeightedMerge({qs})({sketch}) AS {field}")
        else:
            valid = f"{column} > 0" if latency else "1"
            measures.append(
                f"quantilesExactWeightedIf({qs})({column}, toUInt64(greatest(1, round(weight))), {valid}) AS {field}"
            )
    group = _group(by, step)
    head = f"{select}, " if select else ""
    df = query_df(client, f"SELECT {head}{', '.join(measures)} FROM {table} WHERE {where}{group}", parameters=params)
    for field in fields:
        values = df.pop(field) if len(df) else pd.Series([], dtype=object)
        for i, q in enumerate(levels):
            df[f"{field}_q{q:g}"] = [v[i] if len(v) > i else float("nan") for v in values]
    return _finish(df, p, step, by)


# outcomes that count against the service: what the client did (client_abort) does not
SERVER_ERRORS = ("rejected", "timeout", "upstream_error", "no_replica")


def error_ratio(
    client: Client,
    start: datetime,
    end: datetime,
    by: list[str] | tuple[str, ...] = ("model",),
    *,
    source: str | None = "gateway",
    filters: Filters | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """Per group over ``[start, end)``: weighted ``requests``, ``errors`` (the outcomes in
    ``SERVER_ERRORS``; the gateway sets them from 5xx answers, timeouts and refusals) and ``error_ratio`` = errors /
    requests."""
    by = tuple(by)
    totals = request_totals(client, start, end, (*by, "outcome"), source=source, filters=filters, now=now)
    if totals.empty:
        return pd.DataFrame(columns=[*by, "requests", "errors", "error_ratio"])
    totals["errors"] = totals["requests"].where(totals["outcome"].isin(SERVER_ERRORS), 0.0)
    out = (
        totals.groupby(list(by), as_index=False)[["requests", "errors"]].sum()
        if by
        else pd.DataFrame([{"requests": totals["requests"].sum(), "errors": totals["errors"].sum()}])
    )
    out["error_ratio"] = (out["errors"] / out["requests"]).where(out["requests"] > 0)
    return out
