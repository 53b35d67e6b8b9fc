"""The gateways in front of the engines: which are seen, what each gives, and their own figures.

In:  a client and a window: the request log's gateway rows (``requests.gateway``) and the
     gateways' and routers' own metric families (``vllm_router_*``, ``litellm_*``, ``envoy_*``,
     the production-stack router's ``production_stack:*``, llm-d's ``inference_*``).
Out: - ``gateways_seen``: ``[gateway, requests_logged, families]`` per gateway seen in the window;
     - ``GIVES`` / ``what_it_gives`` / ``missing_words``: which request fields each gateway's
       telemetry gives, and the sentence pages and ``explain`` say when one is missing ("vllm-router
       logs no requests: no tenant, no route reason, no tokens per request ...");
     - ``overview``: all of the above for one window (the Traffic page's gateway section);
     - ``router_figures(kind)``: the gateway's own numbers per worker / team / server / pool:
       vllm-router: requests, served and failed per worker, policy decisions, health and circuit
       breaker; LiteLLM: requests, failures, input and output tokens per team (or end user);
       production-stack: QPS, running, healthy and mean latency per server, requests per model;
       llm-d: KV-cache utilisation, queue and ready pods per pool, requests per model; Envoy:
       upstream requests per cluster and response code. Workers named by URL get the replica of
       the scrape target at that address (``replica`` column).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from analytics.errors import BadInput
from analytics.frames import query_df
from analytics.metrics import counter_increases, gauge_summaries
from analytics.tiers import param_time
from storage.clickhouse import Client

__all__ = [
    "FAMILIES",
    "GIVES",
    "GatewayOverview",
    "Gives",
    "overview",
    "gaps",
    "gateways_seen",
    "missing_words",
    "router_figures",
    "what_it_gives",
]

# a gateway's own metric families, by the prefix of their stored names
FAMILIES: dict[str, tuple[str, ...]] = {
    "vllm-router": ("vllm_router_",),
    "litellm": ("litellm_",),
    "envoy": ("envoy_",),
    "production-stack": ("production_stack:",),
    "llm-d": ("inference_objective_", "inference_pool_", "inference_extension_", "inference_model_"),
}
FIELDS = ("tenant", "route", "route_reason", "backend", "tokens", "cached_tokens", "ttft")
_FIELD_WORDS = {
    "tenant": "no tenant",
    "route": "no route",
    "route_reason": "no route reason",
    "backend": "no serving replica",
    "tokens": "no tokens per request",
    "cached_tokens": "no cached tokens",
    "ttft": "no time to first token",
}


@dataclass(frozen=True)
class Gives:
    """What a gateway's telemetry tells of each request."""

    request_log: bool
    fields: frozenset[str]
    how: str  # where it comes from, in words


GIVES: dict[str, Gives] = {
    "fleetscope": Gives(True, frozenset(FIELDS), "fleetscope's gateway request log"),
    "litellm": Gives(
        True,
        frozenset({"tenant", "route", "route_reason", "backend", "tokens", "cached_tokens", "ttft"}),
        "LiteLLM's request records (tenant: team, else end user; route: model group, or the decision "
        "a router hook records; time to first token not in its otel span)",
    ),
    "envoy": Gives(
        True,
        frozenset({"tenant", "route", "backend", "tokens", "cached_tokens"}),
        "Envoy's OpenTelemetry access log (tenant from a request header; tokens from the response's usage)",
    ),
    "genai": Gives(
        True, frozenset({"backend", "tokens", "cached_tokens"}), "OpenTelemetry GenAI spans (tenant only as user.id)"
    ),
    "vllm-router": Gives(False, frozenset(), "vllm-router's metrics only: requests and decisions per worker"),
    "production-stack": Gives(False, frozenset(), "the production-stack router's metrics only"),
    "llm-d": Gives(False, frozenset(), "llm-d's endpoint picker's metrics only"),
}


def what_it_gives(gateway: str) -> Gives:
    """``GIVES`` of a gateway; a user mapping's name is taken to give what its rows hold."""
    return GIVES.get(gateway, Gives(True, frozenset(FIELDS), f"the request mapping {gateway!r}"))


def missing_words(gateway: str, needed: tuple[str, ...] = FIELDS) -> str:
    """What ``gateway`` does not give of ``needed``, in words ('' when it gives them all)."""
    gives = what_it_gives(gateway)
    if not gives.request_log:
        return (
            f"{gateway} logs no requests ({gives.how}): no tenant, no route reason and no tokens per request. "
            "Cost per tenant and why the router chose a pool need a gateway that logs requests: LiteLLM, Envoy "
            "or fleetscope's gateway (docs/gateways.md)"
        )
    missing = [_FIELD_WORDS[f] for f in needed if f not in gives.fields]
    return f"{gateway} gives {', '.join(missing)} ({gives.how})" if missing else ""


def gateways_seen(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """``[gateway, requests_logged, families]``: each gateway whose request rows or own metrics
    the window holds (rows from before ``requests.gateway`` count as fleetscope's)."""
    params = {"s": param_time(start), "e": param_time(end)}
    logged = query_df(
        client,
        """SELECT if(gateway = '', 'fleetscope', gateway) AS gateway, sum(weight) AS requests_logged
           FROM requests WHERE source = 'gateway' AND ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)}
           GROUP BY gateway""",
        parameters=params,
    )
    prefixes = [p for ps in FAMILIES.values() for p in ps]
    families = query_df(
        client,
        """SELECT DISTINCT metric FROM series
           WHERE last_seen >= {s:DateTime64(3)} - INTERVAL 15 MINUTE AND first_seen < {e:DateTime64(3)}
             AND multiSearchAny(metric, {p:Array(String)})""",
        parameters={**params, "p": prefixes},
    )
    counts: dict[str, int] = {}
    for metric in families["metric"] if len(families) else []:
        for kind, ps in FAMILIES.items():
            if str(metric).startswith(ps):
                counts[kind] = counts.get(kind, 0) + 1
    rows: dict[str, dict[str, Any]] = {}
    for _, r in logged.iterrows():
        rows[str(r["gateway"])] = {
            "gateway": r["gateway"],
            "requests_logged": float(r["requests_logged"]),
            "families": 0,
        }
    for kind, n in counts.items():
        rows.setdefault(kind, {"gateway": kind, "requests_logged": 0.0, "families": 0})["families"] = n
    return pd.DataFrame(list(rows.values()), columns=["gateway", "requests_logged", "families"])


def gaps(
    client: Client,
    start: datetime,
    end: datetime,
    source: str | None,
    needed: tuple[str, ...] = ("tenant", "route_reason"),
    seen: pd.DataFrame | None = None,
) -> list[str]:
    """What the window's gateways do not give of ``needed``, in words (for ``explain`` and the
    pages): a gateway that logs no requests, when the request rows are the engines' (``source``
    not ``gateway``); a logging gateway that lacks a needed field."""
    out = []
    seen = gateways_seen(client, start, end) if seen is None else seen  # ``gateways_seen``, when read already
    for kind, logged in zip(seen["gateway"].astype(str), seen["requests_logged"].astype(float), strict=True):
        if not what_it_gives(kind).request_log:
            if source != "gateway":
                out.append(missing_words(kind, needed))
        elif logged > 0 and (words := missing_words(kind, needed)):
            out.append(words)
    return out


# ---------------------------------------------------------------- a gateway's own figures


def _labels(client: Client, fingerprints: list[int]) -> dict[int, dict[str, str]]:
    if not fingerprints:
        return {}
    rows = client.query(
        "SELECT fingerprint, argMax(labels, last_seen) FROM series WHERE fingerprint IN {f:Array(UInt64)} "
        "GROUP BY fingerprint",
        parameters={"f": fingerprints},
    ).result_rows
    return {int(fp): dict(labels) for fp, labels in rows}


def _born(client: Client, metrics: list[str], start: datetime, end: datetime) -> dict[int, float]:
    """fingerprint -> first value, for counter series first seen in ``[start, end)`` on a target
    scraped without them before (a gateway creates a worker's series at its first request): that
    first value was counted from zero, which an increase between samples cannot see."""
    rows = client.query(
        """
        SELECT b.fingerprint, b.first_value
        FROM (
            SELECT v.fingerprint AS fingerprint, min(v.ts) AS born, argMin(v.value, v.ts) AS first_value
            FROM samples AS v WHERE v.metric IN {m:Array(String)} AND v.ts < {e:DateTime64(3)}
            GROUP BY v.fingerprint HAVING born >= {s:DateTime64(3)}
        ) AS b
        INNER JOIN (SELECT fingerprint, argMax(instance, last_seen) AS instance FROM series
                    WHERE metric IN {m:Array(String)} GROUP BY fingerprint) AS s ON s.fingerprint = b.fingerprint
        INNER JOIN (SELECT instance, min(ts) AS first_scrape FROM scrapes
                    WHERE up = 1 AND ts >= {s:DateTime64(3)} - INTERVAL 15 MINUTE AND ts < {e:DateTime64(3)}
                    GROUP BY instance) AS t ON t.instance = s.instance
        WHERE b.born > t.first_scrape""",
        parameters={"m": metrics, "s": param_time(start), "e": param_time(end)},
    ).result_rows
    return {int(fp): float(value) for fp, value in rows}


def _by_label(
    client: Client, kind: str, metrics: list[str], start: datetime, end: datetime, label: str | tuple[str, ...]
) -> pd.DataFrame:
    """``[metric, key, value]``: counter increases (``kind='counter'``) or last gauge values per the
    first non-empty of ``label`` (a label name, or names tried in order)."""
    names = (label,) if isinstance(label, str) else label
    if kind == "counter":
        df = counter_increases(client, metrics, start, end, by="fingerprint")
        value = "increase"
        born = _born(client, metrics, start, end)
        if len(df) and born:
            df["increase"] = df["increase"] + df["fingerprint"].map(lambda f: born.get(int(f), 0.0))
    else:
        df = gauge_summaries(client, metrics, start, end, by="fingerprint")
        value = "last"
    if df.empty:
        return pd.DataFrame(columns=["metric", "key", "labels", "value"])
    labels = _labels(client, [int(f) for f in df["fingerprint"]])

    def key(fp: Any) -> str:
        found = labels.get(int(fp), {})
        for name in names:
            text = found.get(name, "")
            if text and text != "None":
                return text
        return "(none)"

    out = pd.DataFrame(
        {
            "metric": df["metric"],
            "key": [key(f) for f in df["fingerprint"]],
            "labels": [labels.get(int(f), {}) for f in df["fingerprint"]],
            "value": df[value].astype(float),
        }
    )
    return out


def _replicas(client: Client, start: datetime, end: datetime) -> dict[str, str]:
    """``host:port`` -> replica, of the window's scrape targets that name one."""
    rows = client.query(
        "SELECT DISTINCT instance, replica FROM scrapes WHERE replica != '' AND replica != instance "
        "AND ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)}",
        parameters={"s": param_time(start), "e": param_time(end)},
    ).result_rows
    return {str(instance): str(replica) for instance, replica in rows}


def _address(url: str) -> str:
    text = url.split("://", 1)[-1]
    return text.split("/", 1)[0].replace("localhost", "127.0.0.1")


def _pivot(parts: dict[str, pd.DataFrame], key: str) -> pd.DataFrame:
    """One row per key, one column per figure (summed over the figure's series of that key)."""
    columns = []
    for name, df in parts.items():
        if df.empty:
            continue
        columns.append(df.groupby("key")["value"].sum().rename(name))
    if not columns:
        return pd.DataFrame(columns=[key, *parts])
    out = pd.concat(columns, axis=1).reset_index().rename(columns={"index": key, "key": key})
    for name in parts:
        if name not in out:
            out[name] = float("nan")
    return out[[key, *parts]].sort_values(key, ignore_index=True)


Figures = tuple[pd.DataFrame, str]  # the figures, one row per what ``by`` names; ``by``


def _vllm_router(client: Client, start: datetime, end: datetime) -> Figures:
    counters = _by_label(
        client,
        "counter",
        ["vllm_router_processed_requests_total", "vllm_router_cb_outcomes_total"],
        start,
        end,
        "worker",
    )
    gauges = _by_label(client, "gauge", ["vllm_router_worker_health", "vllm_router_cb_state"], start, end, "worker")
    outcome = counters["labels"].map(lambda labels: labels.get("outcome", "")) if len(counters) else pd.Series()
    parts = {
        "requests": counters[counters["metric"] == "vllm_router_processed_requests_total"],
        "served": counters[(counters["metric"] == "vllm_router_cb_outcomes_total") & (outcome == "success")],
        "failed": counters[(counters["metric"] == "vllm_router_cb_outcomes_total") & (outcome == "failure")],
        "healthy": gauges[gauges["metric"] == "vllm_router_worker_health"],
        "breaker_open": gauges[gauges["metric"] == "vllm_router_cb_state"],
    }
    out = _pivot(parts, "worker")
    replicas = _replicas(client, start, end)
    out.insert(1, "replica", [replicas.get(_address(str(w)), "") for w in out["worker"]])
    return out, "worker"


def _litellm(client: Client, start: datetime, end: datetime) -> Figures:
    tenant = ("team_alias", "team", "end_user")
    counters = _by_label(
        client,
        "counter",
        [
            "litellm_proxy_total_requests_metric_total",
            "litellm_proxy_failed_requests_metric_total",
            "litellm_input_tokens_metric_total",
            "litellm_output_tokens_metric_total",
        ],
        start,
        end,
        tenant,
    )
    parts = {
        name: counters[counters["metric"] == metric]
        for name, metric in (
            ("requests", "litellm_proxy_total_requests_metric_total"),
            ("failed", "litellm_proxy_failed_requests_metric_total"),
            ("input_tokens", "litellm_input_tokens_metric_total"),
            ("output_tokens", "litellm_output_tokens_metric_total"),
        )
    }
    return _pivot(parts, "team"), "team"


def _production_stack(client: Client, start: datetime, end: datetime) -> Figures:
    gauges = _by_label(
        client,
        "gauge",
        [
            "production_stack:current_qps",
            "production_stack:num_requests_running",
            "production_stack:healthy_pods_total",
            "production_stack:avg_latency",
        ],
        start,
        end,
        "server",
    )
    parts = {
        name: gauges[gauges["metric"] == f"production_stack:{metric}"]
        for name, metric in (
            ("qps", "current_qps"),
            ("running", "num_requests_running"),
            ("healthy", "healthy_pods_total"),
            ("mean_latency_s", "avg_latency"),
        )
    }
    out = _pivot(parts, "server")
    replicas = _replicas(client, start, end)
    out.insert(1, "replica", [replicas.get(_address(str(s)), "") for s in out["server"]])
    return out, "server"


def _llm_d(client: Client, start: datetime, end: datetime) -> Figures:
    gauges = _by_label(
        client,
        "gauge",
        [
            "inference_pool_average_kv_cache_utilization",
            "inference_pool_average_queue_size",
            "inference_pool_ready_pods",
        ],
        start,
        end,
        "name",
    )
    parts = {
        name: gauges[gauges["metric"] == f"inference_pool_{metric}"]
        for name, metric in (
            ("kv_cache_utilization", "average_kv_cache_utilization"),
            ("queue", "average_queue_size"),
            ("ready_pods", "ready_pods"),
        )
    }
    return _pivot(parts, "pool"), "pool"


def _envoy(client: Client, start: datetime, end: datetime) -> Figures:
    counters = _by_label(client, "counter", ["envoy_cluster_upstream_rq"], start, end, "envoy_cluster_name")
    counters = counters[counters["key"] != "fleetscope_collector"]  # its own telemetry exports
    codes = (
        counters["labels"].map(lambda labels: labels.get("envoy_response_code", "")) if len(counters) else pd.Series()
    )
    parts = {
        "requests": counters,
        "errors_5xx": counters[codes.astype(str).str.startswith("5")] if len(counters) else counters,
    }
    return _pivot(parts, "cluster"), "cluster"


# gateway kind -> its figures (the gateways with metrics of their own)
FIGURES: dict[str, Callable[[Client, datetime, datetime], Figures]] = {
    "vllm-router": _vllm_router,
    "litellm": _litellm,
    "production-stack": _production_stack,
    "llm-d": _llm_d,
    "envoy": _envoy,
}


def router_figures(client: Client, kind: str, start: datetime, end: datetime) -> pd.DataFrame:
    """The gateway's own figures over ``[start, end)`` (columns per ``kind``, see the docstring);
    ``.attrs["by"]`` names what a row is (worker, team, server, pool, cluster)."""
    if kind not in FIGURES:
        raise BadInput(f"no figures of its own for gateway {kind!r}; one of {', '.join(FAMILIES)}")
    out, by = FIGURES[kind](client, start, end)
    for name in ("requests", "served", "failed", "input_tokens", "output_tokens", "errors_5xx"):
        if name in out:  # a counter with no series in the window counted nothing
            out[name] = out[name].fillna(0.0)
    out.attrs["by"] = by
    return out


@dataclass
class GatewayOverview:
    """The gateways of a window: ``seen`` (``gateways_seen``), each one's own ``figures`` (those that
    have metrics of their own), what each gives (``gives``: gateway -> sentence) and the ``gaps``."""

    seen: pd.DataFrame
    figures: dict[str, pd.DataFrame]
    gives: dict[str, str]
    gaps: list[str]


def overview(client: Client, start: datetime, end: datetime, source: str | None = None) -> GatewayOverview:
    """``GatewayOverview`` of ``[start, end)``; ``source``: the request rows the pages read
    (``analytics.requests.log_source``), for the gaps."""
    seen = gateways_seen(client, start, end)
    figures = {}
    for kind in seen.loc[seen["families"] > 0, "gateway"] if len(seen) else []:
        frame = router_figures(client, str(kind), start, end)
        if len(frame):
            figures[str(kind)] = frame
    gives = {}
    for kind in seen["gateway"] if len(seen) else []:
        g = what_it_gives(str(kind))
        fields = ", ".join(f.replace("_", " ") for f in FIELDS if f in g.fields) or "no request fields"
        gives[str(kind)] = f"{g.how}: {fields}"
    return GatewayOverview(seen, figures, gives, gaps(client, start, end, source, seen=seen))
