"""Every metric the exporter serves, defined once: name, type, unit, labels, meaning, and the
figure (the analytics read) that gives it.

In:  nothing.
Out: ``FAMILIES`` (in the order of docs/prometheus.md's list), ``BY_NAME``, ``FIGURES`` (the
     reads, in the order a refresh makes them) and ``sample``, the one way a reader makes a
     sample (its labels checked against its family's).

Names follow Prometheus's conventions: the ``fleetscope_`` prefix, what is measured, then the
unit (``_seconds``, ``_ratio`` for 0-1 shares, ``_usd_per_hour``, ``_usd_per_million_tokens``:
money is USD, and a price per 1M tokens is the unit the industry quotes and analytics computes);
counters end in ``_total``. Every figure is a gauge over a window that ends at the refresh:
a window's sum is no counter (it falls as the window moves on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.errors import BadSample

__all__ = ["BY_NAME", "FAMILIES", "FIGURES", "Family", "Sample", "sample"]

# the reads of a refresh, by the name the error counter and the timestamps label them with
FIGURES = ("cost", "slo", "headroom", "prefix", "spec_decode", "stalls")
EXPORTER = "exporter"  # the refresher's own metrics: no read


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # gauge or counter
    unit: str  # the name's unit suffix ("" for a count or a multiple)
    labels: tuple[str, ...]
    help: str
    figure: str  # one of FIGURES, or EXPORTER


@dataclass(frozen=True)
class Sample:
    family: str
    labels: tuple[str, ...]  # the values, in the family's label order
    value: float


def _gauge(name: str, unit: str, labels: tuple[str, ...], figure: str, help_: str) -> Family:
    return Family(name, "gauge", unit, labels, help_, figure)


FAMILIES: tuple[Family, ...] = (
    # cost (analytics.cost.cost_views: one allocation over the window)
    _gauge(
        "fleetscope_model_cost_usd_per_million_tokens",
        "usd_per_million_tokens",
        ("model",),
        "cost",
        "GPU spend of the model's pool (its replicas, idle time included) per 1M tokens it served "
        "(prompt + output) over the window: analytics.cost.cost_per_token by model",
    ),
    _gauge(
        "fleetscope_fleet_cost_usd_per_million_tokens",
        "usd_per_million_tokens",
        (),
        "cost",
        "GPU spend of the whole fleet per 1M tokens it served over the window (cost_per_token's (fleet) row)",
    ),
    _gauge(
        "fleetscope_model_spend_usd_per_hour",
        "usd_per_hour",
        ("model",),
        "cost",
        "GPU spend of the model's pool over the window, per hour of the window (replica uptime x GPUs x price)",
    ),
    _gauge(
        "fleetscope_model_idle_spend_usd_per_hour",
        "usd_per_hour",
        ("model",),
        "cost",
        "the part of fleetscope_model_spend_usd_per_hour spent while the pool's replicas ran no request",
    ),
    _gauge(
        "fleetscope_tenant_cost_usd_per_million_tokens",
        "usd_per_million_tokens",
        ("tenant",),
        "cost",
        "the tenant's share of the pools' spend (showback: by weighted tokens, minute by minute, idle in "
        "proportion) per 1M tokens its requests used over the window: analytics.cost.cost_by_tenant",
    ),
    _gauge(
        "fleetscope_tenant_spend_usd_per_hour",
        "usd_per_hour",
        ("tenant",),
        "cost",
        'the tenant\'s share of the spend over the window, per hour; tenant="(unattributed)" is the spend '
        "of minutes no logged request used, so the tenants add up to the fleet's spend",
    ),
    _gauge(
        "fleetscope_adapter_cost_usd_per_million_tokens",
        "usd_per_million_tokens",
        ("adapter", "model"),
        "cost",
        "a LoRA adapter's share of its base model's pool (model) per 1M tokens over the window: "
        "analytics.cost.cost_by_adapter",
    ),
    _gauge(
        "fleetscope_adapter_spend_usd_per_hour",
        "usd_per_hour",
        ("adapter", "model"),
        "cost",
        "a LoRA adapter's share of its base model's pool spend over the window, per hour",
    ),
    # SLOs (analytics.slo: the targets of the metadata DB)
    _gauge(
        "fleetscope_slo_burn_rate",
        "",
        ("model", "metric", "slo", "window"),
        "slo",
        "how fast the SLO's error budget burns over the window ending now (bad share / (1 - objective); "
        "1 spends the budget exactly over the SLO's period): analytics.slo.burn_rates over its windows",
    ),
    _gauge(
        "fleetscope_slo_objective_ratio",
        "ratio",
        ("model", "metric", "slo"),
        "slo",
        "the share of requests the SLO wants within its threshold",
    ),
    _gauge(
        "fleetscope_slo_threshold_seconds",
        "seconds",
        ("model", "metric", "slo"),
        "slo",
        "the SLO's latency threshold",
    ),
    _gauge(
        "fleetscope_slo_window_coverage_ratio",
        "ratio",
        ("window",),
        "slo",
        "the share of the burn-rate window the store holds data for (a young fleet's 3d are its first "
        "minutes): analytics.slo.window_coverage",
    ),
    # headroom (analytics.saturation.headroom: the window's last quarter)
    _gauge(
        "fleetscope_pool_headroom_ratio",
        "ratio",
        ("model",),
        "headroom",
        "1 - KV-cache usage / its 0.8 target over the window's last quarter; below 0 past the target",
    ),
    _gauge(
        "fleetscope_pool_kv_cache_usage_ratio",
        "ratio",
        ("model",),
        "headroom",
        "the pool's average KV-cache usage over the window's last quarter",
    ),
    _gauge(
        "fleetscope_pool_waiting_requests_per_replica",
        "",
        ("model",),
        "headroom",
        "requests waiting per replica of the pool, on average over the window's last quarter",
    ),
    _gauge(
        "fleetscope_pool_replicas",
        "",
        ("model",),
        "headroom",
        "the pool's replicas that reported over the window's last quarter",
    ),
    _gauge(
        "fleetscope_pool_saturated_replicas",
        "",
        ("model",),
        "headroom",
        "the pool's replicas at 90 % KV-cache usage or more with requests waiting, over the window's last quarter",
    ),
    # prefix cache (analytics.prefix.prefix_misses: at most the window's last 6 hours)
    _gauge(
        "fleetscope_prefix_cache_prompt_tokens_ratio",
        "ratio",
        ("model", "class"),
        "prefix",
        "the share of the model's prompt tokens in each class over the window: hit, routing (warm on another "
        "replica), evicted, new_prefix, unique; from the request log's prompt hashes",
    ),
    _gauge(
        "fleetscope_prefix_cache_hit_ratio",
        "ratio",
        ("source",),
        "prefix",
        'the fleet\'s prefix-cache hit rate over the window: source="engines" as the engines counted it, '
        '"modelled" as the request log\'s model has it, "affinity_routing" what prefix-affinity routing '
        "would have hit",
    ),
    # speculative decoding (analytics.specdecode.acceptance: the recent window)
    _gauge(
        "fleetscope_spec_decode_acceptance_ratio",
        "ratio",
        ("replica", "model"),
        "spec_decode",
        "accepted draft tokens / proposed draft tokens over the recent window, replicas that draft",
    ),
    _gauge(
        "fleetscope_spec_decode_tokens_per_step",
        "",
        ("replica", "model"),
        "spec_decode",
        "tokens one decode step of a request emits (1 + accepted / drafts) over the recent window",
    ),
    # stalls (analytics.stalls: the recent window)
    _gauge(
        "fleetscope_replica_stall_duration_seconds",
        "seconds",
        ("replica", "model"),
        "stalls",
        "how long the replica has held requests without generating a token, while it still does (0: not "
        "stalled), each replica that reported over the recent window",
    ),
    _gauge(
        "fleetscope_replica_stalled",
        "",
        ("replica", "model"),
        "stalls",
        "1 while the replica is stalled for 60 s or longer (analytics.saturation.Targets.stall_s), else 0",
    ),
    # the exporter itself
    _gauge(
        "fleetscope_exporter_last_refresh_timestamp_seconds",
        "seconds",
        (),
        EXPORTER,
        "when the last refresh was (Unix time): every figure's window ends there",
    ),
    _gauge(
        "fleetscope_exporter_refresh_duration_seconds",
        "seconds",
        (),
        EXPORTER,
        "how long the last refresh took, every figure read",
    ),
    _gauge(
        "fleetscope_exporter_figure_timestamp_seconds",
        "seconds",
        ("figure",),
        EXPORTER,
        "when the values shown of each figure were read: older than the last refresh while its reads fail "
        "(the last good values stay)",
    ),
    _gauge(
        "fleetscope_exporter_window_seconds",
        "seconds",
        ("figure",),
        EXPORTER,
        "the window each figure is computed over (slo: its own windows, in the window label)",
    ),
    Family(
        "fleetscope_exporter_refreshes_total",
        "counter",
        "",
        (),
        "refreshes made since the process started",
        EXPORTER,
    ),
    Family(
        "fleetscope_exporter_refresh_errors_total",
        "counter",
        "",
        ("figure",),
        "figure reads that failed (the store away, a GPU type without a price, no metadata DB)",
        EXPORTER,
    ),
)
BY_NAME = {f.name: f for f in FAMILIES}


def sample(family: str, value: float | None, **labels: str) -> Sample | None:
    """A sample of ``family`` (None for a value that is not a finite number: no data is no sample).
    Raises ``BadSample`` for labels that are not the family's."""
    known = BY_NAME.get(family)
    if known is None:
        raise BadSample(f"no metric family {family!r} in exporter.families.FAMILIES")
    if set(labels) != set(known.labels):
        raise BadSample(f"{family} takes the labels {', '.join(known.labels) or '(none)'}, not {', '.join(labels)}")
    if value is None or not math.isfinite(float(value)):
        return None
    return Sample(family, tuple(str(labels[k]) for k in known.labels), float(value))
