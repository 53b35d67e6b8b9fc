"""``fleetscope up``'s status line: the store's last minutes -> one line of text.

In:  the ClickHouse client (the scrapes, request logs and histograms the collector wrote), the
     metadata DB's sessions (SLO targets, alert states) and the time it is now.
Out: one line: replicas up, requests/s, each model's p99 TTFT beside its SLO target, the fullest
     KV cache, alerts firing (and pending), and any gateway that was not scraped.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.clickhouse import Client

__all__ = ["status_line"]


def status_line(client: Client, sessions: Any, now: datetime | None = None) -> str:
    """Replicas up, requests/s, each model's p99 TTFT over the last 5 minutes beside its SLO target
    (where it has one; with fewer than 100 requests in the 5 minutes, "too few to judge": the
    rules do not compare such a p99 either), the fullest KV cache, alerts firing (and pending)."""
    from alerts.store import load_states
    from analytics.health import current, scrape_health
    from analytics.requests import prefer_source, request_totals
    from analytics.saturation import saturation

    end = now or datetime.now(UTC)
    health = scrape_health(client, end - timedelta(seconds=30), end)  # the targets scraped now (not a past run's)
    gateways = health[health["job"] == "gateway"] if len(health) else health
    health = current(health[health["job"] != "gateway"]) if len(health) else health  # the engines, not retired
    up = int(health["up"].sum()) if len(health) else 0
    # each request once: the gateway's log when there is one, else the engines' spans
    totals = request_totals(client, end - timedelta(minutes=1), end, by=["source"], source=None)
    per_source = dict(zip(totals["source"], totals["requests"], strict=True)) if len(totals) else {}
    chosen = prefer_source(s for s, n in per_source.items() if n)
    rate = float(per_source[chosen]) / 60 if chosen else 0.0
    p99 = _p99_ttft(client, sessions, end)
    sat = saturation(client, end - timedelta(minutes=1), end, "replica")
    kv = float(sat["kv_max"].max()) if len(sat) else float("nan")
    states = [i.state for found in load_states(sessions).values() for i in found.values()]
    firing, pending = states.count("firing"), states.count("pending")
    return (
        f"replicas up {up}/{len(health)} · {rate:.1f} req/s · p99 TTFT (5 min) {p99 or '–'} · KV max {kv:.0%} "
        f"(1 min) · firing alerts {firing}"
        + (f" (pending {pending})" if pending else "")
        + "".join(
            f" · gateway {row.instance} not scraped: {row.last_error}" for row in gateways.itertuples() if not row.up
        )
    ).replace("nan%", "–")


def _p99_ttft(client: Client, sessions: Any, end: datetime) -> str:
    """Each model's p99 TTFT over the 5 minutes to ``end``, beside its SLO target ('' for none)."""
    from alerts.read_slo import min_requests_for
    from analytics.metrics import histogram_quantile
    from analytics.vllm import TTFT
    from storage.catalog import slo_targets

    ttft = histogram_quantile(client, TTFT, 0.99, end - timedelta(minutes=5), end, "model")
    targets = {t.model: t.threshold_seconds for t in slo_targets(sessions) if t.metric == "ttft"}
    least = min_requests_for(0.99)  # fewer: their p99 is their slowest, as the SLO rules judge it

    def p99_of(model: str, q: float, n: float) -> str:
        slo = f"SLO {targets[model]:g}s" if model in targets else ""
        if n < least:
            return f"{model} too few to judge ({n:.0f} of {least} requests" + (f"; {slo})" if slo else ")")
        return f"{model} {q:.2f}s" + (f" ({slo})" if slo else "")

    return ", ".join(
        p99_of(model, q, n)
        for model, q, n in sorted(zip(ttft["model"], ttft["quantile"], ttft["count"], strict=True))
        if not math.isnan(q)  # a model with no request in the 5 minutes is left out
    )
