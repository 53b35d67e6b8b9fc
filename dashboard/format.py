"""Tables a person can read: how every page turns an ``analytics`` frame into a table.

In:  a DataFrame as ``analytics`` returns it (snake_case columns; shares as fractions, seconds,
     dollars, counts, UTC timestamps) and, where a page means something of its own by a column,
     its own ``labels`` (column -> label, or (label, kind)).
Out: ``table(df, labels=None)`` -> a pandas ``Styler`` for ``st.dataframe``: a copy whose columns
     carry human labels with their units (``COLUMNS``: "Cost per 1M tokens ($)"; a column it does
     not know reads as words, "busy_spend" -> "Busy spend"), whose numbers are rounded to 4
     significant digits (what a cell holds, what sorting uses, what AppTest sees), and whose cells
     print: thousands separators; yes/no; dollars with cents from $1, whole dollars from $1,000,
     3 significant digits under $1; percentages from shares and durations (ms under a second,
     then s, min, h), both to 3 significant digits; times as HH:MM:SS (MM-DD HH:MM:SS where a
     column spans days; a page states UTC once, in its caption); "–" where there is no number.
     ``label(name)``, ``sig(value)`` and ``cell(value, kind)``: one header, one value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "COLUMNS",
    "COUNT",
    "NUM",
    "PCT",
    "SECONDS",
    "TEXT",
    "TIME",
    "USD",
    "cell",
    "label",
    "sig",
    "table",
]

TEXT, BOOL, PCT, USD, COUNT, NUM, SECONDS, TIME, RATE, SIGNED_USD, SIGNED_PCT = (
    "text",
    "yes/no",
    "percent",
    "usd",
    "count",
    "number",
    "seconds",
    "time",
    "rate",
    "signed_usd",
    "signed_percent",
)
NONE = "–"
DIGITS = 4  # significant digits a cell holds

# column -> (label, kind): the columns ``analytics`` returns, as a table heads and prints them
COLUMNS: dict[str, tuple[str, str]] = {
    # who and where
    "model": ("Model", TEXT),
    "replica": ("Replica", TEXT),
    "tenant": ("Tenant", TEXT),
    "pool": ("Pool", TEXT),
    "to_pool": ("To pool", TEXT),
    "route": ("Route", TEXT),
    "gpu_type": ("GPU type", TEXT),
    "source": ("Source", TEXT),
    "label": ("SLO", TEXT),
    "metric": ("Metric", TEXT),
    "signal": ("Signal", TEXT),
    "feature": ("Feature", TEXT),
    "detail": ("Detail", TEXT),
    "reason": ("Reason", TEXT),
    "value": ("Value", TEXT),
    # saturation and capacity
    "kv_avg": ("KV cache used (avg)", PCT),
    "kv_max": ("KV cache used (max)", PCT),
    "kv_recent": ("KV cache used now (avg)", PCT),
    "kv_max_recent": ("KV cache used now (max)", PCT),
    "waiting_avg": ("Waiting (avg)", NUM),
    "waiting_max": ("Waiting (max)", NUM),
    "running_avg": ("Running (avg)", NUM),
    "running_max": ("Running (max)", NUM),
    "waiting_per_replica": ("Waiting per replica", NUM),
    "preemptions_per_s": ("Preemptions/s", RATE),
    "prefix_hit_rate": ("Prefix-cache hit rate", PCT),
    "iteration_tokens_avg": ("Tokens per engine step (avg)", NUM),
    "replicas": ("Replicas", COUNT),
    "recommended": ("Recommended replicas", COUNT),
    "change": ("Change", COUNT),
    "headroom": ("Headroom", PCT),
    "ttft_p99_recent": ("p99 TTFT now", SECONDS),
    "ttft_p99_before": ("p99 TTFT before", SECONDS),
    "up_share": ("Scrapes OK", PCT),
    "scrape_seconds_avg": ("Scrape time (avg)", SECONDS),
    "up_seconds": ("Up in window", SECONDS),
    # requests and latency
    "requests": ("Requests", COUNT),
    "requests_before": ("Requests before", COUNT),
    "requests_after": ("Requests after", COUNT),
    "errors": ("Errors", COUNT),
    "prompt_tokens": ("Prompt tokens", COUNT),
    "completion_tokens": ("Completion tokens", COUNT),
    "cached_tokens": ("Cached prompt tokens", COUNT),
    "tokens": ("Tokens", COUNT),
    "tokens_after": ("Tokens after", COUNT),
    "p50": ("p50", SECONDS),
    "p90": ("p90", SECONDS),
    "p95": ("p95", SECONDS),
    "p99": ("p99", SECONDS),
    "quantile": ("Quantile", SECONDS),
    "before_s": ("Before", SECONDS),
    "after_s": ("After", SECONDS),
    "lead_s": ("Lead", SECONDS),
    "threshold_seconds": ("Target", SECONDS),
    "attainment": ("Attainment", PCT),
    "objective": ("Objective", PCT),
    "met": ("Met", BOOL),
    "observed": ("Observed", SECONDS),
    "goodput_per_s": ("Goodput (requests/s)", NUM),
    "goodput_per_gpu_s": ("Goodput per GPU (requests/s)", NUM),
    "gpus": ("GPUs", COUNT),
    "good": ("Good requests", COUNT),
    "budget": ("Error budget", PCT),
    "consumed": ("Budget consumed", PCT),
    "remaining": ("Budget remaining", PCT),
    "burn_rate": ("Burn rate", NUM),
    # shares and drift
    "share": ("Share", PCT),
    "share_before": ("Share before", PCT),
    "share_after": ("Share after", PCT),
    "baseline_share": ("Share before", PCT),
    "after_share": ("Share after", PCT),
    "slow_share": ("Share of the slow requests", PCT),
    "moved": ("Moved", PCT),
    "idle_share": ("Idle share", PCT),
    "score": ("Score", NUM),
    "test": ("Test", TEXT),
    "threshold": ("Threshold", NUM),
    "drifted": ("Drifted", BOOL),
    "reference_rows": ("Reference rows", COUNT),
    "current_rows": ("Current rows", COUNT),
    # cost
    "spend": ("Spend ($)", USD),
    "busy_spend": ("Busy spend ($)", USD),
    "idle_spend": ("Idle spend ($)", USD),
    "gpu_hours": ("GPU hours", NUM),
    "usd_per_gpu_hour": ("Price per GPU hour ($)", USD),
    "cost_per_million_tokens": ("Cost per 1M tokens ($)", USD),
    "usd_per_million": ("Change per 1M tokens ($)", SIGNED_USD),
    "usd_per_million_before": ("Per 1M tokens before ($)", USD),
    "usd_per_million_after": ("Per 1M tokens after ($)", USD),
    "weighted_tokens": ("Weighted tokens", COUNT),
    "direct": ("Busy spend ($)", USD),
    "idle": ("Idle spend ($)", USD),
    "input_per_million": ("Input per 1M tokens ($)", USD),
    "cached_per_million": ("Cached input per 1M tokens ($)", USD),
    "output_per_million": ("Output per 1M tokens ($)", USD),
    "reference": ("Hosted API", TEXT),
    "reference_cost": ("At its list prices ($)", USD),
    "our_cost": ("Self-hosted spend ($)", USD),
    "ratio": ("Self-hosted / list price (×)", NUM),
    "gpu_count": ("GPUs", COUNT),
    # scrapes
    "instance": ("Instance", TEXT),
    "job": ("Job", TEXT),
    "scrapes": ("Scrapes", COUNT),
    "up": ("Up now", BOOL),
    "samples": ("Samples", COUNT),
    "last_attempt": ("Last scrape", TIME),
    "last_success": ("Last success", TIME),
    "last_error": ("Last error", TEXT),
    # an explanation's strata and evidence
    "band": ("Prompt length", TEXT),
    "q_before": ("Quantile before", SECONDS),
    "q_after": ("Quantile after", SECONDS),
    "slowdown": ("Slowdown (×)", NUM),
    "kind": ("Kind", TEXT),
    "example": ("Reason, as logged", TEXT),
    "prompt_before": ("Median prompt before (tokens)", COUNT),
    "prompt_after": ("Median prompt after (tokens)", COUNT),
    "before": ("Before", TEXT),
    "after": ("After", TEXT),
    # what if (planner)
    "fleet": ("Fleet", TEXT),
    "setup": ("Set-up", TEXT),
    "p50_ttft": ("p50 TTFT", SECONDS),
    "p99_ttft": ("p99 TTFT", SECONDS),
    "p50_itl": ("p50 ITL", SECONDS),
    "p99_itl": ("p99 ITL", SECONDS),
    "slo_attainment": ("SLO attainment", PCT),
    "goodput": ("Goodput (requests/s)", NUM),
    "hit_rate": ("Prefix-cache hit rate", PCT),
    "kv_mean": ("KV cache used (mean)", PCT),
    "kv_saturated": ("KV cache saturated (share of time)", PCT),
    "rejected": ("Rejected", COUNT),
    "spend_per_hour": ("Spend per hour ($)", USD),
    "p99_ttft_observed": ("p99 TTFT observed", SECONDS),
    "p99_ttft_replayed": ("p99 TTFT replayed", SECONDS),
    "p99_ttft_error": ("p99 TTFT error", SIGNED_PCT),
    "p50_ttft_observed": ("p50 TTFT observed", SECONDS),
    "p50_ttft_replayed": ("p50 TTFT replayed", SECONDS),
    "p99_itl_observed": ("p99 ITL observed", SECONDS),
    "p99_itl_replayed": ("p99 ITL replayed", SECONDS),
    "kv_mean_observed": ("KV used observed (mean)", PCT),
    "kv_mean_replayed": ("KV used replayed (mean)", PCT),
    "kv_mean_error_points": ("KV error (points)", NUM),
    "within": ("Within tolerance", BOOL),
    "hit": ("Hit (tokens)", COUNT),
    "routing": ("Routing misses (tokens)", COUNT),
    "evicted": ("Evicted (tokens)", COUNT),
    "new_prefix": ("New prefixes (tokens)", COUNT),
    "unique": ("Unshared (tokens)", COUNT),
    # speculative decoding and LoRA adapters
    "drafts": ("Drafts", COUNT),
    "draft_tokens": ("Draft tokens", COUNT),
    "accepted": ("Accepted tokens", COUNT),
    "generation_tokens": ("Output tokens", COUNT),
    "k": ("Draft length (tokens)", NUM),
    "acceptance_rate": ("Acceptance rate", PCT),
    "mean_accepted_length": ("Tokens per decode step", NUM),
    "draft_efficiency": ("Draft efficiency", PCT),
    "speedup": ("Decode speed-up (at most)", NUM),
    "position": ("Draft position", COUNT),
    "adapter": ("Adapter", TEXT),
    "base": ("Base model", TEXT),
    "resident_share": ("Ran in (share of active intervals)", PCT),
    "waiting_share": ("Had requests waiting in (share of active intervals)", PCT),
    "blocked_share": ("Waited for a slot in (share of active intervals)", PCT),
    "intervals": ("Scrape intervals", COUNT),
    "ttft_p50": ("p50 TTFT", SECONDS),
    "ttft_p99": ("p99 TTFT", SECONDS),
    "itl_p99": ("p99 ITL", SECONDS),
    "e2e_p99": ("p99 end-to-end", SECONDS),
    # times
    "ts": ("Time", TIME),
    "moved_at": ("Moved at", TIME),
}


def sig(value: Any, digits: int = DIGITS) -> Any:
    """``value`` rounded to ``digits`` significant digits (0, NaN and non-numbers as they are)."""
    if not isinstance(value, int | float | np.number) or isinstance(value, bool | np.bool_):
        return value
    x = float(value)
    if x == 0 or not math.isfinite(x):
        return value
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _sig_text(x: float, digits: int = 3, *, trim: bool = False) -> str:
    """``x`` with ``digits`` significant digits, no exponent, thousands separated; ``trim``: without
    trailing zeros (a count of requests waiting reads 9, not 9.00)."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{round(x, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if trim and "." in text else text


def _usd(x: float) -> str:
    sign, x = ("-" if x < 0 else ""), abs(x)
    if x >= 1000:
        return f"{sign}${x:,.0f}"
    if x >= 1:
        return f"{sign}${x:,.2f}"
    return f"{sign}${_sig_text(x)}"


def _seconds(x: float) -> str:
    if abs(x) < 1:
        return f"{_sig_text(x * 1000)} ms"
    if abs(x) < 120:
        return f"{_sig_text(x)} s"
    if abs(x) < 7200:
        return f"{_sig_text(x / 60)} min"
    return f"{_sig_text(x / 3600)} h"


def _time(x: Any) -> str:
    return pd.Timestamp(x).strftime("%H:%M:%S")


def _day_and_time(x: Any) -> str:
    return pd.Timestamp(x).strftime("%m-%d %H:%M:%S")


_PRINT: dict[str, Callable[[Any], str]] = {
    PCT: lambda x: f"{_sig_text(x * 100)}%",
    SIGNED_PCT: lambda x: ("+" if x > 0 else "") + f"{_sig_text(x * 100)}%",
    USD: _usd,
    SIGNED_USD: lambda x: ("+" if x > 0 else "") + _usd(x),
    COUNT: lambda x: f"{round(x):,}",
    NUM: lambda x: _sig_text(x, trim=True),
    RATE: lambda x: f"{_sig_text(x, trim=True)}/s",
    SECONDS: _seconds,
    TIME: _time,
    BOOL: lambda x: "yes" if x else "no",
}


def _day_and_time_or_none(value: Any) -> str:
    return NONE if pd.isna(value) else _day_and_time(value)


def _printer(kind: str) -> Callable[[object], str]:
    """``cell`` for the values of one column of ``kind``."""
    return lambda value: cell(value, kind)


def cell(value: Any, kind: str) -> str:
    """One value as a table of ``kind`` prints it ("–" for no number)."""
    if pd.api.types.is_scalar(value) and pd.isna(value):  # None, NaN, NaT, NA
        return NONE
    printer = _PRINT.get(kind)
    if kind == BOOL:
        return _PRINT[BOOL](value)
    if printer is None or isinstance(value, str):
        return str(value)
    return printer(value)


def _words(name: str) -> str:
    text = name.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def _kind_of(name: str, series: pd.Series) -> str:
    """A column ``COLUMNS`` does not name: its kind from its dtype and the suffixes analytics uses."""
    if pd.api.types.is_datetime64_any_dtype(series):
        return TIME
    if not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
        return TEXT
    if name.endswith(("_share", "_rate")) or name.startswith("share_"):
        return PCT
    if name.endswith(("_s", "_seconds")):
        return SECONDS
    if name.endswith(("_usd", "spend")) or name.startswith("usd_"):
        return USD
    if name.endswith("_per_s"):
        return RATE
    if pd.api.types.is_integer_dtype(series):
        return COUNT
    return NUM


def _days(series: pd.Series) -> int:
    dates = series.dropna()
    return int(dates.dt.date.nunique()) if len(dates) else 0


def label(name: str) -> str:
    """The header a table gives column ``name``."""
    known = COLUMNS.get(name)
    return known[0] if known else _words(str(name))


def table(df: pd.DataFrame, labels: Mapping[str, str | tuple[str, str]] | None = None) -> Any:
    """``df`` as a table a person reads (see the module docstring): a ``Styler`` for ``st.dataframe``."""
    labels = labels or {}
    out = pd.DataFrame(index=range(len(df)))
    printers: dict[str, Callable[[object], str]] = {}
    for name in df.columns:
        series = df[name].reset_index(drop=True)
        given = labels.get(name)
        if isinstance(given, tuple):
            head, kind = given
        else:
            known = COLUMNS.get(name)
            kind = known[1] if known and known[1] != TEXT else _kind_of(name, series)
            head = given or label(name)
        if kind == TIME and not pd.api.types.is_datetime64_any_dtype(series):
            series = pd.to_datetime(series, utc=True, errors="coerce")
        if kind == COUNT and pd.api.types.is_float_dtype(series):
            series = series.round().astype("Int64")
        elif pd.api.types.is_float_dtype(series):
            series = series.map(sig).astype(float)
        while head in out.columns:  # two columns a page labels alike stay apart
            head += " "
        out[head] = series
        if kind == TIME and _days(series) > 1:  # times on more than one day carry the date
            printers[head] = _day_and_time_or_none
        else:
            printers[head] = _printer(kind)
        if series.isna().any():  # Streamlit prints an empty cell "None" whatever the Styler says:
            out[head] = series.map(printers[head])  # such a column is printed here (it sorts as text)
            printers[head] = str
    formatters: dict[Any, str | Callable[[object], str] | None] = dict(printers)
    return out.style.format(formatters, na_rep=NONE)
