"""The figures: each read of ``analytics`` a refresh makes, turned into samples.

In:  ``Stores`` (a ClickHouse client, and the metadata DB's sessions for the GPU prices and the
     SLO targets), the refresh time ``at`` (every window ends there) and ``Params`` (the windows,
     the token weights).
Out: ``READERS``: figure name (``exporter.families.FIGURES``) -> a function giving that figure's
     ``Sample`` list. Every number is one ``analytics`` computed (cost: ``cost_views``; SLOs:
     ``burn_rates``, ``window_coverage``; ``headroom``; ``prefix_misses``; ``acceptance``;
     ``stalled_steps`` and ``episodes``, what ``stalls`` is made of); this module only divides a
     window's spend by its hours and a class's tokens by the prompt's. No data is no sample; a
     failing read raises (the refresher counts it and keeps the last good values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from analytics.allocation import FLEET
from analytics.cost import TokenWeights, cost_views
from analytics.prefix import CLASSES, MAX_SPAN, prefix_misses
from analytics.saturation import Targets, headroom
from analytics.slo import burn_rates, window_coverage
from analytics.specdecode import acceptance
from analytics.stalls import episodes, replica_models, stalled_steps
from analytics.tiers import Plan
from exporter.families import Sample, sample
from storage.catalog import gpu_prices, slo_targets
from storage.clickhouse import Client

__all__ = ["READERS", "Params", "Reader", "Stores", "duration_label", "windows"]


@dataclass
class Stores:
    """What the figures are read from; ``close`` gives back what was opened for them."""

    client: Client
    sessions: Any = None  # the metadata DB's sessionmaker (GPU prices, SLO targets); None: neither figure
    close: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class Params:
    window: timedelta = timedelta(hours=1)  # cost, spend, headroom, prefix cache
    recent: timedelta = timedelta(minutes=10)  # stalls, draft acceptance
    weights: TokenWeights | None = None  # how tokens share the spend (settings' cost section)


Reader = Callable[[Stores, datetime, Params], list[Sample]]


def windows(params: Params) -> dict[str, timedelta]:
    """Each figure's window (SLOs have several, in their samples' ``window`` label)."""
    return {
        "cost": params.window,
        "headroom": params.window,
        "prefix": min(params.window, MAX_SPAN),
        "spec_decode": params.recent,
        "stalls": params.recent,
    }


def duration_label(span: timedelta) -> str:
    """A window as Prometheus writes a duration: ``5m``, ``1h``, ``3d``, ``1h30m``."""
    seconds, out = int(span.total_seconds()), ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


def _kept(*found: Sample | None) -> list[Sample]:
    return [s for s in found if s is not None]


def _hours(plan: Plan) -> float:
    return (plan.end - plan.start).total_seconds() / 3600.0


def read_cost(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per model pool, tenant and adapter: USD per 1M tokens and per hour over the window."""
    if stores.sessions is None:
        return []
    prices = gpu_prices(stores.sessions)
    views = cost_views(stores.client, at - params.window, at, prices, weights=params.weights, now=at)
    hours = _hours(views.per_model.attrs["plan"])  # the window answered: whole minutes (hours on the rollups)
    out: list[Sample | None] = []
    for row in views.per_model.to_dict("records"):
        model = str(row["model"])
        if model == FLEET:
            out.append(sample("fleetscope_fleet_cost_usd_per_million_tokens", row["cost_per_million_tokens"]))
            continue
        out += [
            sample("fleetscope_model_cost_usd_per_million_tokens", row["cost_per_million_tokens"], model=model),
            sample("fleetscope_model_spend_usd_per_hour", row["spend"] / hours, model=model),
            sample("fleetscope_model_idle_spend_usd_per_hour", row["idle_spend"] / hours, model=model),
        ]
    for row in views.tenants.to_dict("records"):
        tenant = str(row["tenant"])
        out += [
            sample("fleetscope_tenant_cost_usd_per_million_tokens", row["cost_per_million_tokens"], tenant=tenant),
            sample("fleetscope_tenant_spend_usd_per_hour", row["spend"] / hours, tenant=tenant),
        ]
    for row in views.adapters.to_dict("records"):
        names = {"adapter": str(row["adapter"]), "model": str(row["base"])}
        out += [
            sample("fleetscope_adapter_cost_usd_per_million_tokens", row["cost_per_million_tokens"], **names),
            sample("fleetscope_adapter_spend_usd_per_hour", row["spend"] / hours, **names),
        ]
    return _kept(*out)


def read_slo(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per SLO target: its burn rate over each window of ``analytics.slo.BURN_WINDOWS``, its
    objective and threshold; each window's coverage."""
    if stores.sessions is None:
        return []
    targets = slo_targets(stores.sessions)
    if not targets:
        return []
    out: list[Sample | None] = []
    for t in targets:
        names = {"model": t.model, "metric": t.metric, "slo": t.label}
        out += [
            sample("fleetscope_slo_objective_ratio", t.objective, **names),
            sample("fleetscope_slo_threshold_seconds", t.threshold_seconds, **names),
        ]
    rates = burn_rates(stores.client, targets, at, now=at)
    spans: dict[timedelta, None] = {}
    seen: set[tuple[str, str, str, timedelta]] = set()
    for row in rates.to_dict("records"):
        for span, burn in ((row["long_window"], row["burn_long"]), (row["short_window"], row["burn_short"])):
            spans[span] = None
            key = (row["model"], row["metric"], row["label"], span)
            if key in seen:  # a window both long (of one pair) and short (of another): the same read
                continue
            seen.add(key)
            names = {"model": row["model"], "metric": row["metric"], "slo": row["label"]}
            out.append(sample("fleetscope_slo_burn_rate", burn, window=duration_label(span), **names))
    for span in spans:
        covered = window_coverage(stores.client, at - span, at)
        out.append(sample("fleetscope_slo_window_coverage_ratio", covered, window=duration_label(span)))
    return _kept(*out)


def read_headroom(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per model pool over the window's last quarter: headroom, KV usage, queue, replicas."""
    if not replica_models(stores.client):  # no engine ever reported (a new store): no pool to judge
        return []
    df = headroom(stores.client, at - params.window, at, now=at)
    out: list[Sample | None] = []
    for row in df.to_dict("records"):
        model = str(row["model"])
        out += [
            sample("fleetscope_pool_headroom_ratio", row["headroom"], model=model),
            sample("fleetscope_pool_kv_cache_usage_ratio", row["kv_recent"], model=model),
            sample("fleetscope_pool_waiting_requests_per_replica", row["waiting_per_replica"], model=model),
            sample("fleetscope_pool_replicas", row["replicas"], model=model),
            sample("fleetscope_pool_saturated_replicas", len(row["saturated"]), model=model),
        ]
    return _kept(*out)


def read_prefix(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per model: the share of its prompt tokens in each class; the fleet's hit rates."""
    df = prefix_misses(stores.client, at - params.window, at, "model")
    out: list[Sample | None] = []
    if len(df):
        tokens = df.groupby("model")[list(CLASSES)].sum()
        for model, row in tokens.iterrows():
            total = float(row.sum())
            if total > 0:
                out += [
                    sample(
                        "fleetscope_prefix_cache_prompt_tokens_ratio", row[c] / total, model=str(model), **{"class": c}
                    )
                    for c in CLASSES
                ]
    for source, key in (
        ("modelled", "hit_rate"),
        ("engines", "observed_hit_rate"),
        ("affinity_routing", "affinity_hit_rate"),
    ):
        if key in df.attrs:
            out.append(sample("fleetscope_prefix_cache_hit_ratio", df.attrs[key], source=source))
    return _kept(*out)


def read_spec_decode(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per replica that drafts: its acceptance rate and tokens per decode step."""
    df = acceptance(stores.client, at - params.recent, at, "replica", now=at)
    if df.empty:
        return []
    models = replica_models(stores.client)
    out: list[Sample | None] = []
    for row in df.to_dict("records"):
        names = {"replica": str(row["replica"]), "model": models.get(str(row["replica"]), "")}
        out += [
            sample("fleetscope_spec_decode_acceptance_ratio", row["acceptance_rate"], **names),
            sample("fleetscope_spec_decode_tokens_per_step", row["mean_accepted_length"], **names),
        ]
    return _kept(*out)


def read_stalls(stores: Stores, at: datetime, params: Params) -> list[Sample]:
    """Per replica that reported in the recent window: how long its ongoing stall has lasted (0:
    none), and whether that is a stall (``Targets.stall_s`` or longer)."""
    steps = stalled_steps(stores.client, at - params.recent, at, now=at)
    found = episodes(steps)
    ongoing = found[found["ongoing"].astype(bool)] if len(found) else found
    seconds = {str(r): float(s) for r, s in zip(ongoing["replica"], ongoing["seconds"], strict=True)}
    replicas = steps[["replica", "model"]].drop_duplicates("replica").sort_values("replica")
    limit = Targets().stall_s
    out: list[Sample | None] = []
    for replica, model in zip(replicas["replica"].astype(str), replicas["model"].astype(str), strict=True):
        held = seconds.get(replica, 0.0)
        out += [
            sample("fleetscope_replica_stall_duration_seconds", held, replica=replica, model=model),
            sample("fleetscope_replica_stalled", float(held >= limit), replica=replica, model=model),
        ]
    return _kept(*out)


READERS: dict[str, Reader] = {
    "cost": read_cost,
    "slo": read_slo,
    "headroom": read_headroom,
    "prefix": read_prefix,
    "spec_decode": read_spec_decode,
    "stalls": read_stalls,
}
