"""What the Streamlit dashboard shows for each shipped Grafana panel: the analytics call its page
makes, answered in the panel's own columns, so a test can put the two side by side.

In:  a client on a store and a ``View`` (the window, the step the panel's SQL used, the model
     filter the Grafana ``model`` variable stands for).
Out: ``COUNTERPARTS``: per (dashboard uid, panel id) a ``Counterpart``: the Streamlit page and
     panel (None where the page shows no such chart, and the analytics function it would call is
     named instead), the columns that identify a row, the Grafana unit each number must carry
     (analytics' units: seconds, shares 0-1, per second, USD) and ``read``, which returns a
     DataFrame with the panel's column names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from analytics.cost import cost_per_token, cost_views
from analytics.filters import Filters
from analytics.latency import LEVELS, latency_over_time
from analytics.metrics import gauge_summary
from analytics.requests import prefer_source, request_totals
from analytics.saturation import kv_over_time, saturation
from analytics.timeseries import counter_rates_over_time, histograms
from analytics.vllm import GENERATION_TOKENS, ITL, KV_CACHE_USAGE, PROMPT_TOKENS, TTFT
from tests.analytics.scenario_data import PRICES

__all__ = ["COUNTERPARTS", "PRICES", "Counterpart", "View"]

FLEET = "(fleet)"
USD = "currencyUSD"
TOKENS_PER_S = "suffix: tok/s"


@dataclass(frozen=True)
class View:
    """The window a panel was expanded for, as the Streamlit page is asked for it."""

    start: datetime
    end: datetime
    step: int  # seconds per step of the engine-metric time series (whole buckets of their rollup)
    requests_step: int  # the same for the request log's (whole buckets of its rollup: no 6-hour one)
    filters: Filters | None  # the Grafana model variable's choice (None: All)

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Counterpart:
    page: str | None  # "Page › panel" on the Streamlit dashboard; None: not drawn there
    call: str  # the analytics function that answers it
    keys: tuple[str, ...]  # the columns that identify a row ("time" for a time series)
    units: dict[str, str]  # value column -> the Grafana unit it must be shown in
    read: Callable[[Any, View], pd.DataFrame]


def _one(**values: Any) -> pd.DataFrame:
    """A one-row answer (a stat panel's) from analytics' scalars."""
    return pd.DataFrame([{k: float(v) for k, v in values.items()}])


def _stepped(df: pd.DataFrame, **columns: str) -> pd.DataFrame:
    """Analytics' per-step frame with ``ts`` as ``time`` and its columns renamed to the panel's."""
    out = df.rename(columns={"ts": "time", **{v: k for k, v in columns.items()}})
    return out.reset_index(drop=True)


def requests_per_s(c: Any, v: View) -> pd.DataFrame:
    # Overview: the gateway's rows when it logged any, else the engines' spans (dashboard/screens/overview.py)
    by_source = request_totals(c, v.start, v.end, by=["source"], source=None, filters=v.filters)
    source = prefer_source(by_source["source"])
    requests = by_source.loc[by_source["source"] == source, "requests"].sum()
    return _one(requests_per_s=requests / v.seconds if source else float("nan"))


def tokens_per_s(c: Any, v: View) -> pd.DataFrame:
    fleet = cost_per_token(c, v.start, v.end, PRICES, filters=v.filters).set_index("model").loc[FLEET]
    return _one(tokens_per_s=(fleet["prompt_tokens"] + fleet["completion_tokens"]) / v.seconds)


def _window_p99(family: str) -> Callable[[Any, View], pd.DataFrame]:
    def read(c: Any, v: View) -> pd.DataFrame:
        found = histograms(c, (TTFT, ITL), (0.99,), v.start, v.end, "model", filters=v.filters, total=True)
        window = found[family].window
        return _one(p99=float(window.loc[window["model"] == FLEET, "value"].iloc[0]))

    return read


def kv_fleet(c: Any, v: View) -> pd.DataFrame:
    sat = saturation(c, v.start, v.end, "replica", filters=v.filters)
    return _one(kv_used_avg=float(sat["kv_avg"].mean()), kv_peak=float(sat["kv_max"].max()))


def ttft_by_model(c: Any, v: View) -> pd.DataFrame:
    steps = histograms(c, (TTFT,), (0.99,), v.start, v.end, "model", step=v.step, filters=v.filters, total=True)
    found = steps[TTFT].steps
    return _stepped(found[found["model"] != FLEET][["ts", "model", "value"]], p99="value")


def itl_by_model(c: Any, v: View) -> pd.DataFrame:
    found = latency_over_time(c, "itl", v.start, v.end, levels=LEVELS, by="model", step=v.step, filters=v.filters)
    found = found[(found["source"] == "engine histograms") & (found["q"] == 0.99)]
    return _stepped(found[["ts", "model", "value"]], p99="value")


def kv_by_replica(c: Any, v: View) -> pd.DataFrame:
    found = kv_over_time(c, v.start, v.end, "replica", step=v.step, filters=v.filters)
    return _stepped(found[["ts", "replica", "kv_avg"]], kv_used="kv_avg")


def kv_per_replica(c: Any, v: View) -> pd.DataFrame:
    found = gauge_summary(c, KV_CACHE_USAGE, v.start, v.end, "replica", filters=v.filters)
    return found[["replica", "avg", "max"]].rename(columns={"avg": "kv_avg", "max": "kv_peak"})


def requests_by_model(c: Any, v: View) -> pd.DataFrame:
    # the Traffic page reads the gateway's rows (request_totals' default source)
    found = request_totals(c, v.start, v.end, by=["model"], step=v.requests_step, filters=v.filters)
    found = found.assign(per_s=found["requests"] / found.attrs["step"])
    return _stepped(found[["ts", "model", "per_s"]], requests_per_s="per_s")


def tokens_by_model(c: Any, v: View) -> pd.DataFrame:
    rates = counter_rates_over_time(
        c, [PROMPT_TOKENS, GENERATION_TOKENS], v.start, v.end, "model", step=v.step, filters=v.filters
    )
    summed = rates.groupby(["ts", "model"])["rate"].sum().reset_index()
    return _stepped(summed, tokens_per_s="rate")


def fleet_cost(c: Any, v: View) -> pd.DataFrame:
    fleet = cost_views(c, v.start, v.end, PRICES, filters=v.filters).per_model.set_index("model").loc[FLEET]
    return _one(
        cost_per_hour=fleet["spend"] * 3600 / v.seconds,
        cost_per_million_tokens=fleet["cost_per_million_tokens"],
    )


def cost_by_model(c: Any, v: View) -> pd.DataFrame:
    per_model = cost_views(c, v.start, v.end, PRICES, filters=v.filters).per_model
    return per_model[list(COST_BY_MODEL)]


def showback(c: Any, v: View) -> pd.DataFrame:
    return cost_views(c, v.start, v.end, PRICES, filters=v.filters).tenants[list(SHOWBACK)]


def spend_by_replica(c: Any, v: View) -> pd.DataFrame:
    return cost_views(c, v.start, v.end, PRICES, filters=v.filters).spend[list(SPEND)]


COST_BY_MODEL = {
    "model": "",
    "spend": USD,
    "idle_spend": USD,
    "prompt_tokens": "short",
    "cached_tokens": "short",
    "completion_tokens": "short",
    "cost_per_million_tokens": USD,
    "idle_share": "percentunit",
}
SHOWBACK = {
    "tenant": "",
    "requests": "short",
    "prompt_tokens": "short",
    "completion_tokens": "short",
    "spend": USD,
    "share": "percentunit",
    "cost_per_million_tokens": USD,
}
SPEND = {
    "replica": "",
    "model": "",
    "gpu_type": "",
    "gpu_count": "short",
    "gpu_hours": "short",
    "busy_spend": USD,
    "idle_spend": USD,
    "spend": USD,
}


def _values(units: dict[str, str]) -> dict[str, str]:
    return {k: u for k, u in units.items() if u}


OVERVIEW, COST = "fleetscope-overview", "fleetscope-cost"
COUNTERPARTS: dict[tuple[str, int], Counterpart] = {
    (OVERVIEW, 1): Counterpart(
        "Overview › Requests/s", "request_totals", (), {"requests_per_s": "reqps"}, requests_per_s
    ),
    (OVERVIEW, 2): Counterpart(
        "Overview › Tokens/s", "cost_per_token", (), {"tokens_per_s": TOKENS_PER_S}, tokens_per_s
    ),
    (OVERVIEW, 3): Counterpart("Overview › p99 TTFT", "histograms", (), {"p99": "s"}, _window_p99(TTFT)),
    (OVERVIEW, 4): Counterpart("Overview › p99 ITL", "histograms", (), {"p99": "s"}, _window_p99(ITL)),
    (OVERVIEW, 5): Counterpart(
        "Overview › KV cache used (avg), KV cache peak",
        "saturation",
        (),
        {"kv_used_avg": "percentunit", "kv_peak": "percentunit"},
        kv_fleet,
    ),
    (OVERVIEW, 6): Counterpart(
        "Overview › p99 TTFT by model", "histograms", ("time", "model"), {"p99": "s"}, ttft_by_model
    ),
    (OVERVIEW, 7): Counterpart(
        "Latency › ITL, engine histograms, p99", "latency_over_time", ("time", "model"), {"p99": "s"}, itl_by_model
    ),
    (OVERVIEW, 8): Counterpart(
        "Cache & capacity › KV-cache usage per replica",
        "kv_over_time",
        ("time", "replica"),
        {"kv_used": "percentunit"},
        kv_by_replica,
    ),
    (OVERVIEW, 9): Counterpart(
        "Cache & capacity › the heatmap's replicas and peaks",
        "gauge_summary",
        ("replica",),
        {"kv_avg": "percentunit", "kv_peak": "percentunit"},
        kv_per_replica,
    ),
    (OVERVIEW, 10): Counterpart(
        "Traffic & drift › Requests per second by model",
        "request_totals",
        ("time", "model"),
        {"requests_per_s": "reqps"},
        requests_by_model,
    ),
    (OVERVIEW, 11): Counterpart(
        None, "counter_rates_over_time", ("time", "model"), {"tokens_per_s": TOKENS_PER_S}, tokens_by_model
    ),
    (COST, 1): Counterpart(
        "Overview › Cost per hour; Cost › Per 1M tokens",
        "cost_views",
        (),
        {"cost_per_hour": USD, "cost_per_million_tokens": USD},
        fleet_cost,
    ),
    (COST, 2): Counterpart("Cost › By model", "cost_views", ("model",), _values(COST_BY_MODEL), cost_by_model),
    (COST, 3): Counterpart("Cost › Showback by tenant", "cost_views", ("tenant",), _values(SHOWBACK), showback),
    (COST, 4): Counterpart(
        "Cost › Spend by replica", "cost_views", ("replica", "model", "gpu_type"), _values(SPEND), spend_by_replica
    ),
}
