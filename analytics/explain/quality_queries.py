"""Every read ``explain_quality`` makes of the store: the evaluated answers' span, the rate per
period, each dimension value's flagged and evaluated answers per step, a group's max_tokens and
finish reasons, and a tenant's model mix with the routes that carried it.

In:  a client, the periods (baseline start, break, end of the rise), the step, the flag column
     (``truncated``, ``refusal``, ``empty_answer``), ``Filters``.
Out: DataFrames of weighted sums (every count is a sum of ``weight``, as ``analytics.quality``
     counts): ``span`` (evaluated rows, their weighted sum, first and last arrival), ``rates``
     (per period), ``contributions`` (per step, dimension and value), ``limits`` (a group's
     max_tokens quantiles and share of answers at finish_reason 'length', per period and per
     step), ``model_mix`` (a tenant's requests per model, route and route reason, per period) and
     ``mix_steps`` (per step and model). Only the gateway's rows carry scores
     (``source = 'gateway'``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import pandas as pd

from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.tiers import param_time
from storage.clickhouse import Client

__all__ = [
    "DIMENSIONS",
    "FLAGS",
    "Span",
    "contributions",
    "limits",
    "mix_steps",
    "model_mix",
    "rates",
    "span",
]

SOURCE = "gateway"  # the only rows that carry scores (analytics.quality)
# the rate explained -> the request column that flags an answer
FLAGS = {"truncation": "truncated", "refusal": "refusal", "empty": "empty_answer"}
DIMENSIONS = ("tenant", "model", "route", "route_reason")
QUANTILES = (0.1, 0.5, 0.9)
_W = "toFloat64(weight)"
_IW = "toUInt64(greatest(1, round(weight)))"  # the exact weighted quantiles take whole weights
_PERIOD = "if(ts < {b:DateTime64(3)}, 'before', 'after')"


class Span(NamedTuple):
    rows: int  # evaluated rows (answers scored), unweighted: what the noise of a rate depends on
    weighted: float  # their weighted sum
    first: datetime | None
    last: datetime | None


def _where(
    start: datetime, end: datetime, filters: Filters | None, extra: dict[str, datetime] | None = None
) -> tuple[str, dict[str, Any]]:
    condition, params = request_rows(SOURCE, filters)
    params.update(s=param_time(start), e=param_time(end))
    for name, t in (extra or {}).items():
        params[name] = param_time(t)
    return f"ts >= {{s:DateTime64(3)}} AND ts < {{e:DateTime64(3)}} AND {condition}", params


def span(client: Client, start: datetime, end: datetime, filters: Filters | None) -> Span:
    """The evaluated answers in ``[start, end)``: how many, and the time they cover."""
    where, params = _where(start, end, filters)
    row = client.query(
        f"SELECT count(), sum({_W}), min(ts), max(ts) FROM requests WHERE {where} AND evaluated = 1",
        parameters=params,
    ).result_rows[0]
    rows = int(row[0])
    first, last = (pd.Timestamp(row[2]), pd.Timestamp(row[3])) if rows else (None, None)
    return Span(
        rows,
        float(row[1] or 0.0),
        first.tz_localize("UTC").to_pydatetime() if first is not None and first.tz is None else first,
        last.tz_localize("UTC").to_pydatetime() if last is not None and last.tz is None else last,
    )


def rates(
    client: Client, periods: tuple[datetime, datetime, datetime], flag: str, filters: Filters | None
) -> dict[str, dict[str, float]]:
    """Per period ('before', 'after'): the weighted rate of flagged answers among the evaluated,
    the weighted evaluated answers and the evaluated rows."""
    where, params = _where(periods[0], periods[2], filters, {"b": periods[1]})
    df = query_df(
        client,
        f"""SELECT {_PERIOD} AS period, sumIf({_W}, {flag} = 1) AS w_flagged, sum({_W}) AS w_evaluated,
                   count() AS n_rows
            FROM requests WHERE {where} AND evaluated = 1 GROUP BY period""",
        parameters=params,
    )
    out: dict[str, dict[str, float]] = {}
    for name in ("before", "after"):
        got = df[df["period"] == name]
        flagged = float(got["w_flagged"].iloc[0]) if len(got) else 0.0
        evaluated = float(got["w_evaluated"].iloc[0]) if len(got) else 0.0
        out[name] = {
            "rate": flagged / evaluated if evaluated > 0 else float("nan"),
            "evaluated": evaluated,
            "rows": float(got["n_rows"].iloc[0]) if len(got) else 0.0,
        }
    return out


def contributions(
    client: Client, periods: tuple[datetime, datetime, datetime], step: int, flag: str, filters: Filters | None
) -> pd.DataFrame:
    """Per step, dimension (``DIMENSIONS``) and value: weighted flagged and evaluated answers
    (``[ts, dimension, value, flagged, evaluated]``)."""
    where, params = _where(periods[0], periods[2], filters)
    pairs = ", ".join(f"('{d}', toString({d}))" for d in DIMENSIONS)
    df = query_df(
        client,
        f"""SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {int(step)} SECOND), 3, 'UTC') AS ts,
                   d.1 AS dimension, d.2 AS value,
                   sumIf({_W}, {flag} = 1) AS w_flagged, sum({_W}) AS w_evaluated
            FROM requests ARRAY JOIN [{pairs}] AS d
            WHERE {where} AND evaluated = 1
            GROUP BY ts, dimension, value ORDER BY ts, dimension, value""",
        parameters=params,
    )
    df = df.rename(columns={"w_flagged": "flagged", "w_evaluated": "evaluated"})
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    for name in ("flagged", "evaluated"):
        df[name] = df[name].astype(float)
    return df


def limits(
    client: Client,
    periods: tuple[datetime, datetime, datetime],
    step: int,
    group: tuple[str, str],
    filters: Filters | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A group's (``(dimension, value)``) requests, evaluated or not: per period the weighted
    quantiles (``QUANTILES``) of the max_tokens they asked for and the weighted share that finished
    at 'length'; per step the median max_tokens and that share."""
    where, params = _where(periods[0], periods[2], filters, {"b": periods[1]})
    params["g"] = group[1]
    mine = f"{where} AND toString({group[0]}) = {{g:String}}"
    qs = ", ".join(str(q) for q in QUANTILES)
    measures = (
        f"quantilesExactWeightedIf({qs})(max_tokens, {_IW}, max_tokens > 0) AS max_tokens_q, "
        f"sumIf({_W}, finish_reason = 'length') / sum({_W}) AS length_share, sum({_W}) AS requests"
    )
    periods_df = query_df(
        client, f"SELECT {_PERIOD} AS period, {measures} FROM requests WHERE {mine} GROUP BY period", parameters=params
    )
    steps_df = query_df(
        client,
        f"""SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {int(step)} SECOND), 3, 'UTC') AS ts, {measures}
            FROM requests WHERE {mine} GROUP BY ts ORDER BY ts""",
        parameters=params,
    )
    steps_df["ts"] = pd.to_datetime(steps_df["ts"], utc=True)
    return periods_df, steps_df


def model_mix(
    client: Client, periods: tuple[datetime, datetime, datetime], tenant: str, filters: Filters | None
) -> pd.DataFrame:
    """A tenant's weighted requests per model, route and route reason, before and after the break
    (``[model, route, route_reason, before, after]``)."""
    where, params = _where(periods[0], periods[2], filters, {"b": periods[1]})
    params["tenant_name"] = tenant
    df = query_df(
        client,
        f"""SELECT model, route, route_reason,
                   sumIf({_W}, ts < {{b:DateTime64(3)}}) AS before, sumIf({_W}, ts >= {{b:DateTime64(3)}}) AS after
            FROM requests WHERE {where} AND tenant = {{tenant_name:String}}
            GROUP BY model, route, route_reason""",
        parameters=params,
    )
    for name in ("before", "after"):
        df[name] = df[name].astype(float)
    return df


def mix_steps(
    client: Client, periods: tuple[datetime, datetime, datetime], step: int, tenant: str, filters: Filters | None
) -> pd.DataFrame:
    """A tenant's weighted requests per step and model (``[ts, model, requests]``)."""
    where, params = _where(periods[0], periods[2], filters)
    params["tenant_name"] = tenant
    df = query_df(
        client,
        f"""SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {int(step)} SECOND), 3, 'UTC') AS ts, model,
                   sum({_W}) AS requests
            FROM requests WHERE {where} AND tenant = {{tenant_name:String}} GROUP BY ts, model ORDER BY ts""",
        parameters=params,
    )
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df["requests"] = df["requests"].astype(float)
    return df
