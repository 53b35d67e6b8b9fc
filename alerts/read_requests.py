"""Signal readers of the request log: the server-side error ratio and the traffic mix's drift.

In:  a ``Context`` (the ClickHouse client), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal; a window without request-log rows gives no drift
     sample, not an error. Every number comes from ``analytics`` (``requests``, ``drift``).
"""

from __future__ import annotations

from datetime import datetime

from alerts.reading import Context, Params, Sample, frame, window

__all__ = ["drift_share", "errors"]


def errors(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.requests import error_ratio

    start, end = window(at, p)
    df = error_ratio(ctx.client, start, end, (p["by"],))
    return frame(df, [p["by"]], "error_ratio")


def drift_share(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.drift import drift

    start, end = window(at, p)
    try:
        df = drift(ctx.client, (start, end), p["reference"])
    except ValueError:  # a window without request-log rows: no data, not an error
        return []
    return [Sample({}, float(df.attrs["share_drifted"]))]
