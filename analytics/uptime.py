"""Replica uptime: the seconds each replica was up and busy, bucket by bucket (the cost rule's
spend is these seconds priced: ``analytics.allocation``).

In:  a client, a read plan (tier, window), the grain (seconds per bucket), a step (whole grains,
     or ``None``: the window), the grouping (``replica`` or ``model``) and the series filter's
     SQL condition and parameters.
Out: ``[ts?, replica, model, gpu_type, gpu_count, replicas, up_seconds, busy_seconds]`` per step
     (or over the window) and replica, or model pool and GPU kind (``replica`` then names the
     pool; ``replicas`` counts the replicas seen), ordered by ``ts, replica, gpu_type,
     gpu_count``; with ``replicas_too`` also the per-replica rows over the window (else None).

The rule: a replica costs while its engine reports ``UP_METRIC``. In each grain bucket it is up
from the sample before the bucket's first one (the previous bucket's last) to its own last one,
unless that sample came longer before than the replica's scrapes do (``STALE_INTERVALS`` times
the median gap between its buckets, at least a minute, at most ``LOOKBACK``: a crash or the
collector away is time down); then from the bucket's own first sample. Busy: the bucket's peak
of the gauge was above 0.

How: the store hands over the gauge's rows per series and bucket as they lie in the rollup
(raw samples grouped per bucket first): the bucket's peak and its first and last samples' times,
144k rows over 30 days of 200 replicas read in hours, as Arrow; numpy folds a replica's rows of
one bucket together, puts them in order and computes the gaps, their median per replica, each
bucket's up time and the sums per step and pool. The same work in SQL (a ``GROUP BY`` per replica
and bucket, arrays per replica, ``ARRAY JOIN``, a second ``GROUP BY``) took 117-137 ms p50 where
this takes 68-77 (``docs/analytics.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analytics.frames import arrow_df
from analytics.metrics import LOOKBACK
from analytics.tiers import Plan, between
from analytics.vllm import REQUESTS_RUNNING
from storage.clickhouse import Client

__all__ = ["LOOKBACK_MS", "MIN_STALE_MS", "STALE_INTERVALS", "UP_METRIC", "bucket_ups", "merged", "replica_uptime"]

UP_METRIC = REQUESTS_RUNNING  # every vLLM engine reports it; present while it is up
LOOKBACK_MS = int(LOOKBACK.total_seconds() * 1000)  # the longest gap between samples still counted as up
MIN_STALE_MS = 60_000  # a gap this short is never time down
STALE_INTERVALS = 2.5  # a gap this many times the replica's usual one is time down (a crash, a failed scrape)
SERIES = """
    SELECT fingerprint, argMax(replica, last_seen) AS replica, argMax(model, last_seen) AS model,
           argMax(labels, last_seen) AS labels
    FROM series WHERE metric = {metric:String} GROUP BY fingerprint"""
COLUMN_KINDS = {"fingerprint": np.uint64, "b": np.int64, "first_t": np.int64, "last_t": np.int64, "peak": np.float64}


def _rows_sql(p: Plan, g: int, condition: str) -> str:
    """Per series (``fingerprint``) and bucket of ``g`` seconds (epoch seconds), the gauge's peak
    and the first and last samples' times (epoch ms). A rollup's rows are the buckets already:
    read as they lie, the tuples' first fields only and no grouping (a ``GROUP BY`` of the 144k
    rows of 30 days x 200 replicas took 3-4 times the read); rows of parts not merged yet come
    as more than one row of a bucket (``merged`` folds them)."""
    picked = f" AND v.fingerprint IN (SELECT fingerprint FROM ({SERIES}) AS s WHERE {condition})" if condition else ""
    where = f"v.metric = {{metric:String}} AND {between(p.tier.rollup, 'v.ts', start='lookback')}{picked}"
    if p.tier.rollup:
        return f"""
            SELECT v.fingerprint AS fingerprint, toUnixTimestamp(v.ts) AS b, v.value_max AS peak,
                   toUnixTimestamp64Milli(v.value_first.1) AS first_t, toUnixTimestamp64Milli(v.value_last.1) AS last_t
            FROM {p.samples} AS v WHERE {where}"""
    return f"""
        SELECT v.fingerprint AS fingerprint, toUnixTimestamp(toStartOfInterval(v.ts, INTERVAL {g} SECOND)) AS b,
               max(v.value) AS peak, toUnixTimestamp64Milli(min(v.ts)) AS first_t,
               toUnixTimestamp64Milli(max(v.ts)) AS last_t
        FROM {p.samples} AS v WHERE {where}
        GROUP BY fingerprint, b"""


def _series_sql(condition: str) -> str:
    """Each series of the gauge (as it was last seen): its replica, model and GPU labels (the map
    read once: each label read out of it in the ``GROUP BY`` costs as much as the whole map)."""
    return f"""
        SELECT fingerprint, replica, model, labels['gpu_type'] AS gpu_type,
               toUInt32OrZero(labels['gpu_count']) AS gpu_count
        FROM ({SERIES}) AS s WHERE {condition or 1}"""


def merged(
    rep: np.ndarray, b: np.ndarray, cols: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The buckets in replica and time order, one row per replica and bucket (an engine's several
    series, or rollup rows of parts not merged yet, folded: the earliest first sample, the latest
    last one, the highest peak, a NaN peak skipped as the store's ``max`` skips it). One key,
    replica and bucket, sorted stably: the rows come in sorted runs (a part's rows are in series
    and time order), which the sort merges in less time than an ``ORDER BY`` costs the store."""
    key = rep.astype(np.int64) * (1 << 32) + (b - (b.min() if len(b) else 0))
    order = np.argsort(key, kind="stable")
    key, rep, b = key[order], rep[order], b[order]
    cols = {name: v[order] for name, v in cols.items()}
    starts = np.ones(len(key), dtype=bool)
    starts[1:] = key[1:] != key[:-1]
    if starts.all():
        return rep, b, cols
    # fold the few repeated rows into their run's first (a reduceat over every row costs more)
    repeats = np.flatnonzero(~starts)
    into = (np.cumsum(starts) - 1)[repeats]
    folded = {name: v[starts] for name, v in cols.items()}
    np.minimum.at(folded["first_t"], into, cols["first_t"][repeats])
    np.maximum.at(folded["last_t"], into, cols["last_t"][repeats])
    np.fmax.at(folded["peak"], into, cols["peak"][repeats])
    return rep[starts], b[starts], folded


def bucket_ups(k: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Seconds up of each bucket, given the buckets in replica (``k``) and time order with their
    first and last samples' times (epoch ms): from the previous bucket's last sample where the gap
    to it is no longer than the replica's stale threshold, else from the bucket's own first."""
    n = len(k)
    if not n:
        return np.zeros(0)
    opens = np.ones(n, dtype=bool)  # a replica's first bucket
    opens[1:] = k[1:] != k[:-1]
    group = np.cumsum(opens) - 1
    prev_last = np.empty(n, dtype=np.int64)
    prev_last[0] = 0
    prev_last[1:] = last[:-1]
    gap = first - prev_last
    inner = ~opens
    # the median gap per replica, as ClickHouse's medianExact takes it: the upper middle value
    g_in, gap_in = group[inner], gap[inner]
    ordered = gap_in[np.lexsort((gap_in, g_in))]
    counts = np.bincount(g_in, minlength=int(group[-1]) + 1)
    offsets = np.cumsum(counts) - counts
    middle = np.zeros(len(counts))  # a replica with one bucket has no gap (and no use for one)
    has = counts > 0
    middle[has] = ordered[(offsets + counts // 2)[has]]
    stale = np.minimum(LOOKBACK_MS, np.maximum(MIN_STALE_MS, STALE_INTERVALS * middle))
    since = np.where(inner & (gap <= stale[group]), prev_last, first)
    ups: np.ndarray = np.maximum(0, last - since) / 1000.0
    return ups


def replica_uptime(
    client: Client,
    p: Plan,
    g: int,
    s: int | None,
    *,
    by: str,
    replicas_too: bool,
    condition: str,
    parameters: dict[str, Any],
    start_s: int,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Module docstring; ``start_s``: the window's start (epoch seconds): buckets before it (read
    for their gaps) are left out of the sums."""
    rows = _columns(client, _rows_sql(p, g, condition), parameters)
    series = arrow_df(client, _series_sql(condition), parameters=parameters)
    # each series' replica, numbered in the series' order; ``meta``: one row per replica, in that order
    series = series.sort_values("fingerprint", kind="stable").reset_index(drop=True)
    codes, _ = pd.factorize(series["replica"])
    meta = series.drop_duplicates("replica").reset_index(drop=True)
    fingerprints = series["fingerprint"].to_numpy(np.uint64)
    fp = rows["fingerprint"]
    at = np.minimum(np.searchsorted(fingerprints, fp), max(len(fingerprints) - 1, 0))
    known = fingerprints[at] == fp if len(fingerprints) else np.zeros(len(fp), dtype=bool)
    cols = {name: rows[name][known] for name in ("first_t", "last_t", "peak")}
    rep, b, cols = merged(codes[at[known]], rows["b"][known], cols)
    up = bucket_ups(rep, cols["first_t"], cols["last_t"])
    busy = np.where(cols["peak"] > 0, up, 0.0)
    keep = b >= start_s
    rep, b, up, busy = rep[keep], b[keep], up[keep], busy[keep]
    # only the replicas with a bucket in the window (the series table keeps every replica ever seen)
    runs = np.ones(len(rep), dtype=bool)
    runs[1:] = rep[1:] != rep[:-1]
    meta = meta.iloc[rep[runs]].reset_index(drop=True)
    rep = np.cumsum(runs) - 1
    out = _sums(meta, rep, b, up, busy, s, pooled=by == "model")
    # the per-replica rows over the window, from the same buckets
    return out, _sums(meta, rep, b, up, busy, None, pooled=False) if replicas_too else None


def _columns(client: Client, sql: str, parameters: dict[str, Any]) -> dict[str, np.ndarray]:
    """The rows of ``_rows_sql`` as numpy columns (read as Arrow: a quarter less time than a
    DataFrame for 144k rows)."""
    table = client.query_arrow(sql, parameters=parameters)
    if not table.num_rows:
        return {name: np.zeros(0, dtype=kind) for name, kind in COLUMN_KINDS.items()}
    return {name: table.column(name).to_numpy().astype(kind, copy=False) for name, kind in COLUMN_KINDS.items()}


def _sums(
    meta: pd.DataFrame,
    rep: np.ndarray,
    b: np.ndarray,
    up: np.ndarray,
    busy: np.ndarray,
    s: int | None,
    *,
    pooled: bool,
) -> pd.DataFrame:
    """Up and busy seconds summed per step (``s``; ``None``: the window) and replica (``rep``:
    rows of ``meta``; the rows in replica and time order) or, ``pooled``, per model pool and GPU
    kind, with the replicas counted."""
    # the units (pools, or replicas) numbered in the order of the output's rows
    keys = ["model" if pooled else "replica", "gpu_type", "gpu_count"]
    values = list(zip(*(meta[k].tolist() for k in keys), strict=True))
    ordered = sorted(set(values))
    number = {v: i for i, v in enumerate(ordered)}
    first_row: dict[tuple[Any, ...], int] = {}
    for i, v in enumerate(values):
        first_row.setdefault(v, i)
    unit = np.array([number[v] for v in values], dtype=np.int64)[rep] if len(rep) else np.zeros(0, dtype=np.int64)
    names = meta.iloc[[first_row[v] for v in ordered]].reset_index(drop=True)
    names = names[["replica", "model", "gpu_type", "gpu_count"]]
    if pooled:
        names = names.assign(replica=names["model"])
    n_units = max(len(names), 1)
    first = int(b.min()) // s if s is not None and len(b) else 0
    step = b // s - first if s is not None else np.zeros(len(b), dtype=np.int64)
    cell = step * n_units + unit
    size = (int(step.max()) + 1 if len(step) else 0) * n_units
    # a replica counts once per cell: its rows of a step are adjacent (replica and time order)
    new = np.ones(len(rep), dtype=bool)
    new[1:] = (rep[1:] != rep[:-1]) | (step[1:] != step[:-1])
    if size <= 4 * len(cell) + 4096:  # cells numbered densely: counts and sums by bincount
        replicas = np.bincount(cell[new], minlength=size)
        cells = np.flatnonzero(replicas)
        index = np.zeros(size, dtype=np.int64)
        index[cells] = np.arange(len(cells))
        replicas, at, size = replicas[cells], index[cell], len(cells)
    else:  # sparse (short steps over a long window): the cells that have rows only
        cells, at = np.unique(cell, return_inverse=True)
        replicas, size = np.bincount(at[new], minlength=len(cells)), len(cells)
    out = names.iloc[cells % n_units].reset_index(drop=True)
    out["replicas"] = replicas.astype(np.uint64)
    out["up_seconds"] = np.bincount(at, weights=up, minlength=size)
    out["busy_seconds"] = np.bincount(at, weights=busy, minlength=size)
    if s is not None:
        out.insert(0, "ts", pd.to_datetime((cells // n_units + first) * s, unit="s", utc=True))
    return out
