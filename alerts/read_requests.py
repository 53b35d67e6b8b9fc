"""Signal readers of the request log: the server-side error ratio, the gateway's shedding (admission,
told from failure) and the traffic mix's drift.

In:  a ``Context`` (the ClickHouse client), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal; a window without request-log rows gives no drift
     sample, not an error. Every number comes from ``analytics`` (``requests``, ``admission``,
     ``drift``).
"""

from __future__ import annotations

from datetime import datetime

from alerts.reading import Context, Params, Sample, frame, window

__all__ = ["drift_share", "errors", "shed_ratio"]


def errors(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.requests import error_ratio

    start, end = window(at, p)
    df = error_ratio(ctx.client, start, end, (p["by"],))
    return frame(df, [p["by"]], "error_ratio")


def shed_ratio(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """The share of a group's requests the gateway shed (queue-time budget or tenant share), with each
    reason's share and the requests as ``$extra``: load refused on purpose, not failures (those are
    ``errors``)."""
    from analytics.admission import admission

    start, end = window(at, p)
    df = admission(ctx.client, start, end, {}, by=p["by"])
    out = []
    for row in df.to_dict("records"):
        if not row["requests"]:
            continue
        extra = {
            "queue_time": row["shed_queue_time"] / row["requests"],
            "tenant_share": row["shed_tenant_share"] / row["requests"],
            "requests": row["requests"],
        }
        out.append(Sample({p["by"]: str(row[p["by"]])}, float(row["shed_share"]), extra))
    return out


def drift_share(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.drift import drift

    start, end = window(at, p)
    try:
        df = drift(ctx.client, (start, end), p["reference"])
    except ValueError:  # a window without request-log rows: no data, not an error
        return []
    return [Sample({}, float(df.attrs["share_drifted"]))]
