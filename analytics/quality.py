"""Quality rates of evaluated answers: truncations, refusals, empty answers, repetition, invalid JSON.

In:  a client, a window ``[start, end)``, ``by`` (one dimension or several of ``DIMENSIONS``; none:
     one row for everything), optionally ``step_s`` (rates per step as well), ``filters``
     (``analytics.filters.Filters``) and the rows' ``source``.
Out: ``quality_rates``: a DataFrame, one row per group (and step: ``ts``, the step's start, UTC),
     with ``.attrs["step"]`` (seconds) when stepped; columns:
     - ``requests``: weighted requests of the group (evaluated or not: the evaluated share is
       ``evaluated / requests``);
     - ``evaluated``: weighted requests whose answer was sampled and scored (``evaluated = 1``);
     - ``truncation_rate``, ``refusal_rate``, ``empty_rate``: the weighted share of the evaluated
       requests with ``truncated`` / ``refusal`` / ``empty_answer`` = 1;
     - ``repetition``: the weighted mean ``repetition`` (share of repeated word n-grams, 0-1) of the
       evaluated requests;
     - ``json_asked``: weighted evaluated requests that asked for JSON (``json_valid >= 0``), and
       ``json_invalid_rate``: the share of them whose answer was not valid JSON (``json_valid = 0``);
     each rate NaN where its denominator is 0 (nothing evaluated; no JSON asked). Groups and steps
     without any request row are absent.

Definitions follow the other request analytics (``analytics.requests``, ``analytics.slo``): every
count is a sum of ``weight`` (1 / the collector's sampling probability), so the rates are estimates
of the rates over all requests; the rows read are the gateway's log (``source = 'gateway'``, the
default), the only rows that carry scores (engine spans never do; reading both would count a
request twice in ``requests``), and only the users' requests (the router audit's shadow requests,
``audit_of`` set, are ``analytics.router_audit``'s). The scores are in the raw request log only
(no rollups yet, migration 0014): a window older than the raw retention has no rows.
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

__all__ = ["DIMENSIONS", "quality_rates"]

DIMENSIONS = ("model", "tenant", "route", "route_reason", "gateway", "replica", "finish_reason", "source")
EVALUATED = "evaluated = 1"
# weighted sum (named apart from the table's columns) -> its SQL over the group's rows
_SUMS = {
    "w_requests": "sum(toFloat64(weight))",
    "w_evaluated": f"sumIf(toFloat64(weight), {EVALUATED})",
    "w_truncated": f"sumIf(toFloat64(weight), {EVALUATED} AND truncated = 1)",
    "w_refused": f"sumIf(toFloat64(weight), {EVALUATED} AND refusal = 1)",
    "w_empty": f"sumIf(toFloat64(weight), {EVALUATED} AND empty_answer = 1)",
    "w_repetition": f"sumIf(toFloat64(weight) * toFloat64(repetition), {EVALUATED})",
    "w_json_asked": f"sumIf(toFloat64(weight), {EVALUATED} AND json_valid >= 0)",
    "w_json_invalid": f"sumIf(toFloat64(weight), {EVALUATED} AND json_valid = 0)",
}
# rate column -> (numerator, denominator)
_RATES = {
    "truncation_rate": ("w_truncated", "w_evaluated"),
    "refusal_rate": ("w_refused", "w_evaluated"),
    "empty_rate": ("w_empty", "w_evaluated"),
    "repetition": ("w_repetition", "w_evaluated"),
    "json_invalid_rate": ("w_json_invalid", "w_json_asked"),
}
_KEPT = {"w_requests": "requests", "w_evaluated": "evaluated", "w_json_asked": "json_asked"}


def _dimensions(by: str | Sequence[str] | None) -> list[str]:
    dims = [by] if isinstance(by, str) else list(by or ())
    for dim in dims:
        if dim not in DIMENSIONS:
            raise BadInput(f"cannot group quality rates by {dim!r}; one of {', '.join(DIMENSIONS)}")
    return dims


def quality_rates(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    by: str | Sequence[str] | None = "model",
    step_s: float | None = None,
    filters: Filters | None = None,
    source: str | None = "gateway",
) -> pd.DataFrame:
    """Weighted quality rates of the evaluated requests per ``by`` group (and ``step_s`` step)."""
    dims = _dimensions(by)
    if end <= start:
        raise BadInput(f"the window must end after it starts ({start} .. {end})")
    keys = list(dims)
    select = list(dims)
    if step_s is not None:
        if step_s < 1:
            raise BadInput(f"step_s must be at least 1 second, got {step_s}")
        start, end = align(start, end, timedelta(seconds=int(step_s)))  # whole steps, the metrics' grid
        select.insert(0, f"toDateTime64(toStartOfInterval(ts, INTERVAL {int(step_s)} SECOND), 3, 'UTC') AS step_ts")
        keys.insert(0, "step_ts")
    condition, params = request_rows(source, filters)
    params.update(start=param_time(start), end=param_time(end))
    measures = ", ".join(f"{sql} AS {name}" for name, sql in _SUMS.items())
    group = f" GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    head = f"{', '.join(select)}, " if select else ""
    user = "audit_of = ''"  # the router audit's shadow requests are not the users' (analytics.router_audit)
    sql = f"SELECT {head}{measures} FROM requests WHERE {between(False)} AND {condition} AND {user}{group}"
    df = query_df(client, sql, parameters=params)
    if not keys and len(df) and float(df["w_requests"].iloc[0]) == 0:  # no key: one row even for no rows
        df = df.iloc[0:0]
    for name in _SUMS:
        df[name] = df[name].astype(float)
    for rate, (numerator, denominator) in _RATES.items():
        df[rate] = (df[numerator] / df[denominator]).where(df[denominator] > 0)
    df = df.drop(columns=[name for name in _SUMS if name not in _KEPT]).rename(columns=_KEPT)
    if "step_ts" in df:
        df = df.rename(columns={"step_ts": "ts"})
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
        df.attrs["step"] = int(step_s) if step_s is not None else None
    return df.reset_index(drop=True)
