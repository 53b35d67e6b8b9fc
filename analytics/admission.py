"""Admission at the gateway: what it refused, by reason, and goodput beside throughput.

In:  a client, a window ``[start, end)``, the SLO TTFT targets by model (seconds, e.g.
     ``analytics.slo``'s), ``by`` (one dimension or several of ``DIMENSIONS``; none: one row),
     optionally ``step_s`` (per step as well), ``filters`` and the rows' ``source``.
Out: ``admission``: a DataFrame, one row per group (and step: ``ts``, the step's start, UTC), with
     ``.attrs["seconds"]`` (the step, or the window) and the columns, each a sum of ``weight``:
     - ``requests``: the requests the gateway logged (answered, refused or failed);
     - ``answered``: answered whole (outcome ``ok``); ``throughput_per_s`` = answered / seconds;
     - the refusals by reason (``REASONS``): ``shed_queue_time`` (the gateway's estimate of the
       wait was past the model's budget), ``shed_tenant_share`` (the model was busy and the
       tenant held more than its share), ``rejected`` (a tenant over its rate, or the gateway's
       fixed limits full), ``no_replica`` (no healthy replica served the model); ``shed`` the two
       shed ones, ``shed_share`` = shed / requests, ``refused_share`` = all four / requests;
     - ``good``: answered within the model's TTFT target (a streamed answer's TTFT; a non-streamed
       one's whole answer, an upper bound of its TTFT), ``goodput_per_s`` = good / seconds; NaN
       where none of the group's models has a target.
     Groups and steps without any row are absent. ``.attrs["window_s"]``: the window read.
     ``over_window``: a stepped answer (``by=None``) summed into the one row ``admission`` gives for
     the window.

Shedding is admission, not failure: the shed outcomes are not among the server errors of
``analytics.requests.SERVER_ERRORS`` (the error-rate rules do not count them). Rows read: the
gateway's log (``source = 'gateway'``: only the gateway refuses or sheds), the users' requests (not
the router audit's shadows), in the raw request log (the TTFT against a target needs the rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pandas as pd

from analytics.errors import BadInput
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.tiers import align, between, param_time
from storage.clickhouse import Client

__all__ = ["DIMENSIONS", "REASONS", "admission", "over_window"]

DIMENSIONS = ("model", "tenant", "route", "gateway", "replica")
# outcome -> what the pages call it
REASONS = {
    "shed_queue_time": "queue-time budget",
    "shed_tenant_share": "tenant over its share",
    "rejected": "rate limit or gateway full",
    "no_replica": "no replica",
}
SHED = ("shed_queue_time", "shed_tenant_share")
_FIRST = "if(ttft_seconds > 0, ttft_seconds, e2e_seconds)"


def admission(
    client: Client,
    start: datetime,
    end: datetime,
    targets: dict[str, float],
    *,
    by: str | Sequence[str] | None = "model",
    step_s: float | None = None,
    filters: Filters | None = None,
    source: str | None = "gateway",
) -> pd.DataFrame:
    """Refusals by reason, throughput and goodput per ``by`` group (and ``step_s`` step)."""
    dims = [by] if isinstance(by, str) else list(by or ())
    if unknown := [d for d in dims if d not in DIMENSIONS]:
        raise BadInput(f"cannot group admission by {', '.join(unknown)}: use {', '.join(DIMENSIONS)}")
    if end <= start:
        raise BadInput(f"the window must end after it starts ({start} .. {end})")
    keys, select = list(dims), list(dims)
    if step_s is not None:
        if step_s < 1:
            raise BadInput(f"step_s must be at least 1 second, got {step_s}")
        start, end = align(start, end, timedelta(seconds=int(step_s)))
        select.insert(0, f"toDateTime64(toStartOfInterval(ts, INTERVAL {int(step_s)} SECOND), 3, 'UTC') AS step_ts")
        keys.insert(0, "step_ts")
    condition, params = request_rows(source, filters)
    params.update(
        start=param_time(start), end=param_time(end), models=list(targets), targets=[float(v) for v in targets.values()]
    )
    has_target = "has({models:Array(String)}, model)"
    target = "arrayElement({targets:Array(Float64)}, indexOf({models:Array(String)}, model))"
    weight = "toFloat64(weight)"
    measures = [
        f"sum({weight}) AS requests",
        f"sumIf({weight}, outcome = 'ok') AS answered",
        *(f"sumIf({weight}, outcome = '{reason}') AS {reason}" for reason in REASONS),
        f"sumIf({weight}, outcome = 'ok' AND {has_target} AND {_FIRST} <= {target}) AS good",
        f"countIf({has_target}) AS with_target",
    ]
    group = f" GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    head = f"{', '.join(select)}, " if select else ""
    where = f"{between(False)} AND {condition} AND audit_of = ''"  # the users' requests, not the audit's shadows
    sql = f"SELECT {head}{', '.join(measures)} FROM requests WHERE {where}{group}"
    df = query_df(client, sql, parameters=params)
    if not keys and len(df) and float(df["requests"].iloc[0]) == 0:
        df = df.iloc[0:0]
    for name in ("requests", "answered", "good", *REASONS):
        df[name] = df[name].astype(float)
    window_s = (end - start).total_seconds()  # the window read (whole steps when stepped)
    seconds = float(step_s) if step_s is not None else window_s
    df["shed"] = df[list(SHED)].sum(axis=1)
    df["shed_share"] = (df["shed"] / df["requests"]).where(df["requests"] > 0)
    df["refused_share"] = (df[list(REASONS)].sum(axis=1) / df["requests"]).where(df["requests"] > 0)
    df["good"] = df["good"].where(df["with_target"] > 0)
    df["throughput_per_s"] = df["answered"] / seconds
    df["goodput_per_s"] = df["good"] / seconds
    df = df.drop(columns=["with_target"])
    if "step_ts" in df:
        df = df.rename(columns={"step_ts": "ts"})
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df.attrs["seconds"] = seconds
    df.attrs["window_s"] = window_s
    return df.reset_index(drop=True)


def over_window(stepped: pd.DataFrame) -> pd.DataFrame:
    """``admission``'s answer per step (``by=None``) summed over its window: the same one row
    ``admission`` gives without ``step_s`` (a page drawing the steps needs no second read)."""
    counts = ["requests", "answered", "good", *REASONS]
    if stepped.empty:
        return stepped.drop(columns=["ts"], errors="ignore").iloc[0:0]
    seconds = float(stepped.attrs["window_s"])
    row = {name: float(stepped[name].sum()) for name in counts}
    row["good"] = float(stepped["good"].sum()) if stepped["good"].notna().any() else float("nan")
    out = pd.DataFrame([row])
    out["shed"] = out[list(SHED)].sum(axis=1)
    out["shed_share"] = (out["shed"] / out["requests"]).where(out["requests"] > 0)
    out["refused_share"] = (out[list(REASONS)].sum(axis=1) / out["requests"]).where(out["requests"] > 0)
    out["throughput_per_s"] = out["answered"] / seconds
    out["goodput_per_s"] = out["good"] / seconds
    out.attrs["seconds"] = out.attrs["window_s"] = seconds
    return out
