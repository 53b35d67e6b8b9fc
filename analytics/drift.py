"""Traffic-mix drift: a current window against a reference window, feature by feature, with
Evidently's default tests (DESIGN.md section 5).

In:  a client, the current window, a reference window (``reference_window``: the trailing day,
     or the same hours a week earlier, or any window), ``Filters`` and the request-log source.
Out: ``drift`` -> a DataFrame, one row per feature: ``feature``, ``kind`` (numeric /
     categorical), ``test``, ``score``, ``threshold``, ``drifted``, ``reference_rows``,
     ``current_rows``, ``detail`` (what moved, in words); ``.attrs``: ``share_drifted``,
     ``dataset_drift`` (half the features or more drifted, Evidently's default), ``shares``
     (per categorical feature: each value's share of requests and of tokens in both windows),
     ``windows``.
     ``mix_shares`` -> that share table for one categorical feature.
     ``length_distribution`` -> a numeric feature's histogram in both windows, on shared
     log-spaced bins: ``[window, low, high, requests, share]``.

Tests (Evidently's defaults): with a reference of more than 1,000 rows, numeric features by
the Wasserstein distance normalised by the reference's standard deviation and categorical
ones by the Jensen-Shannon distance (natural log), drift at >= 0.1; with 1,000 rows or fewer,
the two-sample Kolmogorov-Smirnov test (numeric) and the chi-square test (categorical), drift
at p < 0.05 (``score`` is then the p-value). Distributions are weighted by the rows' sampling
weights and aggregated in ClickHouse (weighted quantile functions on a 200-point grid give the
Wasserstein distance, weighted shares the Jensen-Shannon distance; the shares of every
categorical feature come from one pass: the hourly rollup for a window's whole hours, the rows
for the minutes at its edges); the small-sample tests read the rows themselves (at most a few
thousand) and do not weight them.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analytics.errors import BadInput, BadWindow, NoData
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.requests import CONTEXT_BUCKET
from analytics.tiers import HOUR, align, between, param_time
from storage.clickhouse import Client

__all__ = ["CATEGORICAL", "NUMERIC", "drift", "length_distribution", "mix_shares", "reference_window"]

NUMERIC = {
    "prompt_tokens": "toFloat64(prompt_tokens)",
    "output_tokens": "toFloat64(completion_tokens)",
    "max_tokens": "toFloat64(max_tokens)",
    "cached_share": "cached_tokens / greatest(prompt_tokens, 1)",
}
CATEGORICAL = {
    "model": "model",
    "tenant": "tenant",
    "context_bucket": CONTEXT_BUCKET,
    "finish_reason": "finish_reason",
    "route": "route",
}
LARGE = 1000  # reference rows above which the distance tests are used
DISTANCE_THRESHOLD = 0.1
P_THRESHOLD = 0.05
GRID = 200
SMALL_CAP = 50_000  # rows read per window for the small-sample tests


def reference_window(start: datetime, end: datetime, kind: str = "trailing-day") -> tuple[datetime, datetime]:
    """The reference for ``[start, end)``: ``trailing-day`` (the 24 h before it) or
    ``last-week`` (the same hours 7 days earlier)."""
    if kind == "trailing-day":
        return start - timedelta(days=1), start
    if kind == "last-week":
        return start - timedelta(days=7), end - timedelta(days=7)
    raise BadInput("reference must be 'trailing-day' or 'last-week' (or give a window)")


def _where(
    current: tuple[datetime, datetime],
    reference: tuple[datetime, datetime],
    source: str | None,
    filters: Filters | None,
) -> tuple[str, dict[str, object]]:
    params: dict[str, object] = {
        "cs": param_time(current[0]),
        "ce": param_time(current[1]),
        "rs": param_time(reference[0]),
        "re": param_time(reference[1]),
    }
    where = (
        "((ts >= {cs:DateTime64(3)} AND ts < {ce:DateTime64(3)}) OR "
        "(ts >= {rs:DateTime64(3)} AND ts < {re:DateTime64(3)}))"
    )
    condition, extra = request_rows(source, filters)
    where += f" AND {condition}"
    params.update(extra)
    return where, params


WINDOW = "if(ts >= {cs:DateTime64(3)} AND ts < {ce:DateTime64(3)}, 'current', 'reference')"


def _inner_hours(window: tuple[datetime, datetime]) -> tuple[datetime, datetime] | None:
    """The whole hours inside ``window`` (start ceiled, end floored to the hour), or None."""
    start = align(window[0], window[0], HOUR.resolution)[1]
    end = align(window[1], window[1], HOUR.resolution)[0]
    return (start, end) if end > start else None


def _shares(
    client: Client,
    features: list[str],
    current: tuple[datetime, datetime],
    reference: tuple[datetime, datetime],
    source: str | None,
    filters: Filters | None,
) -> dict[str, pd.DataFrame]:
    """Per feature, the share table, from one pass over both windows grouped by every feature at
    once (the features' combinations are few; each feature's sums are taken after). The whole
    hours inside a window are read from the hourly rollup, the minutes at its edges from the
    rows: the same sums as the rows alone, from far fewer rows (a replica filter reads the rows:
    the rollup has no replica)."""
    keys = ", ".join(f"{CATEGORICAL[name]} AS {name}" for name in features)
    groups = ", ".join(features)
    where, params = _where(current, reference, source, filters)
    rows_sql = f"""
        SELECT {WINDOW} AS w, {keys}, count() AS rows, sum(weight) AS requests,
               sum(weight * (prompt_tokens + completion_tokens)) AS tokens
        FROM requests WHERE {where} EDGES GROUP BY w, {groups}"""
    hours = {name: _inner_hours(window) for name, window in (("c", current), ("r", reference))}
    if (filters and filters.replica) or not any(hours.values()):
        df = query_df(client, rows_sql.replace("EDGES", ""), parameters=params)
    else:
        inside = []
        for name, span in hours.items():
            if span:
                params.update({f"{name}hs": param_time(span[0]), f"{name}he": param_time(span[1])})
                inside.append(f"({between(True, start=f'{name}hs', end=f'{name}he')})")
        inside_sql = " OR ".join(inside)
        rolled, extra = request_rows(source, filters, raw=False)
        params.update(extra)
        df = query_df(
            client,
            f"""
            SELECT w, {groups}, sum(rows) AS rows, sum(requests) AS requests, sum(tokens) AS tokens FROM (
                {rows_sql.replace("EDGES", f"AND NOT ({inside_sql})")}
                UNION ALL
                SELECT {WINDOW} AS w, {groups}, sum(rows) AS rows, sum(requests) AS requests,
                       sum(prompt_tokens + completion_tokens) AS tokens
                FROM {HOUR.requests} WHERE ({inside_sql}) AND {rolled} GROUP BY w, {groups})
            GROUP BY w, {groups}""",
            parameters=params,
        )
    out: dict[str, pd.DataFrame] = {}
    for name in features:
        sums = df.assign(value=df[name].astype(str)).groupby(["value", "w"])[["rows", "requests", "tokens"]].sum()
        table = pd.DataFrame(index=pd.Index(sorted(set(sums.index.get_level_values("value"))), name="value"))
        for measure in ("rows", "requests", "tokens"):
            for w in ("reference", "current"):
                part = (
                    sums.xs(w, level="w")[measure] if w in sums.index.get_level_values("w") else pd.Series(dtype=float)
                )
                table[f"{w}_{measure}"] = part.reindex(table.index, fill_value=0).astype(float)
        for measure in ("requests", "tokens"):
            for w in ("reference", "current"):
                total = table[f"{w}_{measure}"].sum()
                table[f"{w}_{measure}_share"] = table[f"{w}_{measure}"] / total if total > 0 else 0.0
        out[name] = table.reset_index().sort_values("value", ignore_index=True)
    return out


def mix_shares(
    client: Client,
    feature: str,
    current: tuple[datetime, datetime],
    reference: tuple[datetime, datetime],
    *,
    source: str | None = "gateway",
    filters: Filters | None = None,
) -> pd.DataFrame:
    """``[value, reference_rows, current_rows, reference_requests, current_requests,
    reference_tokens, current_tokens]`` plus each as a share of its window's total."""
    if feature not in CATEGORICAL:
        raise BadInput(f"unknown categorical feature {feature!r}; one of {', '.join(CATEGORICAL)}")
    return _shares(client, [feature], current, reference, source, filters)[feature]


def length_distribution(
    client: Client,
    feature: str,
    current: tuple[datetime, datetime],
    reference: tuple[datetime, datetime] | str = "trailing-day",
    *,
    bins: int = 24,
    source: str | None = "gateway",
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Weighted histogram of ``prompt_tokens`` or ``output_tokens`` in both windows on the same
    bins (log-spaced from 1 to the largest value seen, so short and long prompts both show)."""
    if feature not in ("prompt_tokens", "output_tokens"):
        raise BadInput("feature must be prompt_tokens or output_tokens")
    if isinstance(reference, str):
        reference = reference_window(current[0], current[1], reference)
    where, params = _where(current, reference, source, filters)
    expr = NUMERIC[feature]
    # each length once per window (a few thousand values), binned here: the bins need the largest first
    sql = (
        f"SELECT {WINDOW} AS w, greatest(1, {expr}) AS x, sum(weight) AS requests, max({expr}) AS top "
        f"FROM requests WHERE {where} GROUP BY w, x"
    )
    df = query_df(client, sql, parameters=params)
    columns = ["window", "low", "high", "requests", "share"]
    top = df["top"].max() if len(df) else None
    if not top or not math.isfinite(float(top)):
        return pd.DataFrame(columns=columns)
    edges = np.unique(np.round(np.geomspace(1, max(float(top), 2.0) + 1, bins + 1)))
    df["bin"] = np.clip(np.searchsorted(edges, df["x"].to_numpy(float), side="right") - 1, 0, len(edges) - 2)
    out = (
        df.groupby(["w", "bin"])["requests"]
        .sum()
        .unstack("w")
        .fillna(0.0)
        .reindex(range(len(edges) - 1), fill_value=0.0)
    )
    frames = []
    for w in ("reference", "current"):
        counts = out[w] if w in out else pd.Series(0.0, index=out.index)
        total = float(counts.sum())
        frames.append(
            pd.DataFrame(
                {
                    "window": w,
                    "low": edges[:-1],
                    "high": edges[1:],
                    "requests": counts.to_numpy(float),
                    "share": counts.to_numpy(float) / total if total > 0 else 0.0,
                }
            )
        )
    result = pd.concat(frames, ignore_index=True)[columns]
    result.attrs["windows"] = {"current": current, "reference": reference}
    return result


def _numeric_large(
    client: Client, where: str, params: dict[str, object], ref_rows: int, cur_rows: int
) -> list[dict[str, Any]]:
    grid = ", ".join(repr((i + 0.5) / GRID) for i in range(GRID))
    parts = []
    for name, expr in NUMERIC.items():
        parts.append(f"quantilesExactWeighted({grid})({expr}, toUInt64(greatest(1, round(weight)))) AS {name}_q")
        parts.append(f"sum(weight * {expr}) AS {name}_s1, sum(weight * pow({expr}, 2)) AS {name}_s2")
    sql = f"SELECT {WINDOW} AS w, sum(weight) AS n, {', '.join(parts)} FROM requests WHERE {where} GROUP BY w"
    rows = {r["w"]: r for r in query_df(client, sql, parameters=params).to_dict("records")}
    out = []
    missing = [w for w in ("reference", "current") if w not in rows]
    for name in NUMERIC:
        if missing:  # older than the raw request log keeps (the shares came from the hourly rollup)
            out.append(
                {
                    "feature": name,
                    "kind": "numeric",
                    "test": "wasserstein",
                    "score": math.nan,
                    "threshold": DISTANCE_THRESHOLD,
                    "drifted": False,
                    "reference_rows": ref_rows,
                    "current_rows": cur_rows,
                    "detail": f"no request rows kept for the {missing[0]} window "
                    "(older than the raw request log's retention)",
                }
            )
            continue
        ref, cur = rows["reference"], rows["current"]
        qr, qc = np.asarray(ref[f"{name}_q"], float), np.asarray(cur[f"{name}_q"], float)
        mean = ref[f"{name}_s1"] / ref["n"]
        std = math.sqrt(max(ref[f"{name}_s2"] / ref["n"] - mean * mean, 0.0))
        distance = float(np.mean(np.abs(qr - qc)))
        score = distance / max(std, 1e-3)
        median_r, median_c = qr[GRID // 2], qc[GRID // 2]
        p95_r, p95_c = qr[int(GRID * 0.95)], qc[int(GRID * 0.95)]
        out.append(
            {
                "feature": name,
                "kind": "numeric",
                "test": "wasserstein",
                "score": score,
                "threshold": DISTANCE_THRESHOLD,
                "drifted": score >= DISTANCE_THRESHOLD,
                "reference_rows": ref_rows,
                "current_rows": cur_rows,
                "detail": f"median {_num(median_r)} -> {_num(median_c)}, p95 {_num(p95_r)} -> {_num(p95_c)}",
            }
        )
    return out


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.2f}"


def _numeric_small(
    client: Client, where: str, params: dict[str, object], ref_rows: int, cur_rows: int
) -> list[dict[str, Any]]:
    exprs = ", ".join(f"{expr} AS {name}" for name, expr in NUMERIC.items())
    sql = f"SELECT {WINDOW} AS w, {exprs} FROM requests WHERE {where} LIMIT {2 * SMALL_CAP}"
    df = query_df(client, sql, parameters=params)
    ref, cur = df[df["w"] == "reference"], df[df["w"] == "current"]
    out = []
    for name in NUMERIC:
        a, b = ref[name].to_numpy(float), cur[name].to_numpy(float)
        p = float(stats.ks_2samp(a, b).pvalue) if len(a) and len(b) else math.nan
        out.append(
            {
                "feature": name,
                "kind": "numeric",
                "test": "ks",
                "score": p,
                "threshold": P_THRESHOLD,
                "drifted": bool(p < P_THRESHOLD),
                "reference_rows": ref_rows,
                "current_rows": cur_rows,
                "detail": f"median {_num(np.median(a)) if len(a) else '-'} -> {_num(np.median(b)) if len(b) else '-'}",
            }
        )
    return out


def _categorical(name: str, shares: pd.DataFrame, large: bool, ref_rows: int, cur_rows: int) -> dict[str, Any]:
    p, q = shares["reference_requests_share"].to_numpy(float), shares["current_requests_share"].to_numpy(float)
    moved = shares.assign(change=q - p).sort_values("change", key=np.abs, ascending=False)
    top = moved.iloc[0] if len(moved) else None
    detail = (
        f"{top['value'] or '(none)'} {top['reference_requests_share']:.0%} -> {top['current_requests_share']:.0%} "
        f"of requests"
        if top is not None
        else ""
    )
    if large:
        m = (p + q) / 2

        def kl(x: np.ndarray) -> float:  # Kullback-Leibler to the midpoint, 0 log 0 = 0
            inside = x > 0
            return float(np.sum(x[inside] * np.log(x[inside] / m[inside])))

        score = math.sqrt(max((kl(p) + kl(q)) / 2, 0.0))
        return {
            "feature": name,
            "kind": "categorical",
            "test": "jensenshannon",
            "score": score,
            "threshold": DISTANCE_THRESHOLD,
            "drifted": score >= DISTANCE_THRESHOLD,
            "reference_rows": ref_rows,
            "current_rows": cur_rows,
            "detail": detail,
        }
    table = shares[["reference_rows", "current_rows"]].to_numpy(float).T
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or (table.sum(axis=1) == 0).any():
        pvalue = 1.0 if table.shape[1] < 2 else math.nan
    else:
        pvalue = float(stats.chi2_contingency(table).pvalue)
    return {
        "feature": name,
        "kind": "categorical",
        "test": "chisquare",
        "score": pvalue,
        "threshold": P_THRESHOLD,
        "drifted": bool(pvalue < P_THRESHOLD),
        "reference_rows": ref_rows,
        "current_rows": cur_rows,
        "detail": detail,
    }


def drift(
    client: Client,
    current: tuple[datetime, datetime],
    reference: tuple[datetime, datetime] | str = "trailing-day",
    *,
    source: str | None = "gateway",
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Feature-by-feature drift of ``current`` against ``reference`` (see the module docstring)."""
    if isinstance(reference, str):
        reference = reference_window(current[0], current[1], reference)
    if current[1] <= current[0] or reference[1] <= reference[0]:
        raise BadWindow("windows must end after they start")
    if reference[0] < current[1] and current[0] < reference[1]:
        raise BadWindow("the reference window overlaps the current one")
    shares = _shares(client, list(CATEGORICAL), current, reference, source, filters)
    counts = shares["model"].set_index("value")[["reference_rows", "current_rows"]].sum()  # every row has a model
    ref_rows, cur_rows = int(counts["reference_rows"]), int(counts["current_rows"])
    columns = ["feature", "kind", "test", "score", "threshold", "drifted", "reference_rows", "current_rows", "detail"]
    if not ref_rows or not cur_rows:
        empty = "reference" if not ref_rows else "current"
        raise NoData(f"the {empty} window holds no request-log rows: nothing to compare")
    large = ref_rows > LARGE
    where, params = _where(current, reference, source, filters)
    rows = (_numeric_large if large else _numeric_small)(client, where, params, ref_rows, cur_rows)
    for name in CATEGORICAL:
        rows.append(_categorical(name, shares[name], large, ref_rows, cur_rows))
    df = pd.DataFrame(rows, columns=columns)
    share = float(df["drifted"].mean())
    df.attrs.update(
        share_drifted=share,
        dataset_drift=share >= 0.5,
        shares=shares,
        windows={"current": current, "reference": reference},
    )
    return df
