"""Counter arithmetic in ClickHouse: stored counter samples -> reset-aware increases.

In:  a client, a counter metric name, a time window, and the label to group by.
Out: a DataFrame ``[group, increase]``. A decrease between two consecutive samples of a series
     is a counter reset (the engine restarted): the sample after the reset counts from zero,
     as Prometheus' ``increase()`` does (without its extrapolation to the window edges), so an
     increase is never negative.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd

__all__ = ["increase", "SERIES_LATEST"]

# one row per fingerprint (series rows are re-written to refresh last_seen)
SERIES_LATEST = """
    SELECT fingerprint, argMax(metric, last_seen) AS metric, argMax(labels, last_seen) AS labels,
           argMax(replica, last_seen) AS replica, argMax(model, last_seen) AS model,
           argMax(instance, last_seen) AS instance
    FROM series GROUP BY fingerprint
"""

_GROUPS = {"replica": "s.replica", "model": "s.model", "instance": "s.instance", "fingerprint": "v.fingerprint"}


def increase(client, metric: str, start: datetime, end: datetime, by: str = "replica") -> pd.DataFrame:  # noqa: ANN001
    """Reset-aware increase of ``metric`` per ``by`` (replica, model, instance, fingerprint)."""
    if by not in _GROUPS:
        raise ValueError(f"by must be one of {', '.join(_GROUPS)}")
    sql = f"""
        SELECT {_GROUPS[by]} AS {by}, sum(if(v.value >= v.prev, v.value - v.prev, v.value)) AS increase
        FROM (
            SELECT fingerprint, ts, value,
                   lagInFrame(value, 1, nan) OVER (PARTITION BY fingerprint ORDER BY ts
                                                   ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev
            FROM samples
            WHERE metric = {{metric:String}} AND ts >= {{start:DateTime64(3)}} AND ts <= {{end:DateTime64(3)}}
        ) AS v
        INNER JOIN ({SERIES_LATEST}) AS s ON s.fingerprint = v.fingerprint
        WHERE NOT isNaN(v.prev)
        GROUP BY {by}
        ORDER BY {by}
    """
    return client.query_df(sql, parameters={"metric": metric, "start": start, "end": end})
