"""Scrape health: which replicas the collector reaches, and since when it does not.

In:  a client and a window (the ``scrapes`` table: one row per scrape attempt).
Out: ``scrape_health`` -> one row per scrape target: ``replica``, ``instance``, ``job``,
     ``scrapes``, ``up_share`` (successful share of the window's attempts), ``up`` (the last
     attempt succeeded), ``last_attempt``, ``last_success`` (ever, not only in the window: so a
     target down for a day says since when), ``last_error``, ``scrape_seconds_avg``, ``samples``
     (of the last successful scrape), ``retired`` (the autoscaler removed the replica by a
     scale-in: a ``removed`` scale event at or after its last successful scrape; see
     ``analytics.elasticity.retired``), ``removed_at``; ``silent_targets`` -> the rows of
     targets whose last attempt failed and that are not retired, each with ``why`` in words ("no
     data from replica r1 since 10:02 UTC — scrape failing: connection refused"); ``current``
     -> the rows of targets that are not retired (what "replicas up n/m" counts).
A retired replica is neither down nor silent: it was stopped on purpose, and a failed scrape after
its engine stopped (the target left the collector a moment late) says nothing about the fleet.
A replica name started again later scrapes successfully after its removal: it is not retired.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.frames import query_df
from analytics.tiers import param_time
from storage.clickhouse import Client

__all__ = ["current", "scrape_health", "silent_targets"]


def scrape_health(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    sql = """
        SELECT replica, instance, job, countIf(ts >= {s:DateTime64(3)}) AS scrapes,
               countIf(ts >= {s:DateTime64(3)} AND up = 1) / greatest(countIf(ts >= {s:DateTime64(3)}), 1) AS up_share,
               argMax(up, ts) = 1 AS up_now, max(ts) AS last_attempt, maxIf(ts, up = 1) AS last_success,
               argMaxIf(error, ts, up = 0) AS last_error,
               avgIf(duration_seconds, ts >= {s:DateTime64(3)}) AS scrape_seconds_avg,
               argMaxIf(samples_scraped, ts, up = 1) AS samples
        FROM scrapes
        WHERE ts < {e:DateTime64(3)} AND ts >= {s:DateTime64(3)} - INTERVAL 7 DAY
        GROUP BY replica, instance, job
        HAVING max(ts) >= {s:DateTime64(3)}
        ORDER BY replica, instance"""
    df = query_df(client, sql, parameters={"s": param_time(start), "e": param_time(end)})
    for col in ("last_attempt", "last_success"):
        df[col] = pd.to_datetime(df[col], utc=True)
    # maxIf over no successful row gives the epoch: never succeeded in the week read
    df.loc[df["last_success"] <= pd.Timestamp(0, tz="UTC"), "last_success"] = pd.NaT
    df = df.rename(columns={"up_now": "up"})  # named apart in SQL: an alias would shadow the column
    df["up"] = df["up"].astype(bool)
    return _retired(client, df, start, end)


def _retired(client: Client, df: pd.DataFrame, start: datetime, end: datetime) -> pd.DataFrame:
    from clickhouse_connect.driver.exceptions import DatabaseError

    from analytics.elasticity import retired

    try:
        removed = retired(client, start, end)[["replica", "removed_at"]]
    except DatabaseError as exc:  # a store not migrated to 0013 yet: no autoscaler wrote there
        if "UNKNOWN_TABLE" not in str(exc):
            raise
        removed = pd.DataFrame({"replica": pd.Series(dtype=str), "removed_at": pd.Series(dtype="datetime64[ns, UTC]")})
    df = df.merge(removed, on="replica", how="left")
    df["removed_at"] = pd.to_datetime(df["removed_at"], utc=True)
    df["retired"] = df["removed_at"].notna() & (df["last_success"].isna() | (df["removed_at"] >= df["last_success"]))
    return df


def current(health: pd.DataFrame) -> pd.DataFrame:
    """The targets that are not retired (a replica a scale-in removed is not part of the fleet)."""
    return health[~health["retired"]] if "retired" in health else health


def silent_targets(health: pd.DataFrame) -> pd.DataFrame:
    """The targets whose last scrape failed, with a sentence each."""
    down = current(health)
    down = down[~down["up"]].copy()

    def why(row: pd.Series) -> str:
        since = (
            f"since {row['last_success']:%Y-%m-%d %H:%M} UTC"
            if pd.notna(row["last_success"])
            else "ever (no successful scrape in the last 7 days)"
        )
        error = (
            str(row["last_error"]).strip().splitlines()[0] if str(row["last_error"]).strip() else "no error recorded"
        )
        return f"no data from replica {row['replica'] or row['instance']} {since} — scrape failing: {error}"

    down["why"] = [why(r) for _, r in down.iterrows()] if len(down) else pd.Series(dtype=str)
    return down
