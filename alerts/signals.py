"""The signal catalogue: ``SIGNALS``, the one list of the built-in signals a rule's ``expr`` can name.

In:  the readers (``alerts.read_engine``, ``read_slo``, ``read_cost``, ``read_requests``,
     ``read_scaling``, ``read_quality``).
Out: ``SIGNALS``: name -> ``Signal`` (its help, its parameters as ``Param`` with defaults and
     kinds, its reader, the labels of its answer). ``alerts.expr`` parses and evaluates by it;
     ``docs/alerts.md``'s signal table lists the same names (``tests/alerts/test_catalogue_docs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts import read_cost, read_engine, read_quality, read_requests, read_scaling, read_slo
from alerts.reading import Reader
from analytics.vllm import KV_CACHE_USAGE, REQUESTS_WAITING

__all__ = ["SIGNALS", "Param", "Signal"]


@dataclass(frozen=True)
class Param:
    default: str
    kind: str = "duration"  # duration | choice | number | text
    choices: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class Signal:
    name: str
    help: str
    params: dict[str, Param]
    fn: Reader
    labels: tuple[str, ...] = ()


BY = Param("replica", "choice", ("replica", "model"), "group by replica or model")
BY_MODEL = Param("model", "choice", ("replica", "model"), "group by model or replica")
W = Param("1m")
W5 = Param("5m")
MIN_DRAFTS = Param("100", "number", help="draft tokens the window must hold (fewer: no value)")
# quality: the answers the gateway scored (a sample), by the dimension a cause lives in
BY_ANSWERS = Param(
    "model", "choice", ("model", "tenant", "route"), "group by model (an adapter is one), tenant or route"
)
MIN_EVALUATED = Param("20", "number", help="evaluated answers (weighted) the window must hold (fewer: no value)")
SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        Signal(
            "replica_up",
            "1 when the target's last scrape succeeded, 0 when it failed",
            {"window": W},
            read_engine.replica_up,
            ("replica", "instance", "job"),
        ),
        Signal(
            "scrape_success_ratio",
            "share of successful scrapes per target",
            {"window": W5},
            read_engine.scrape_success,
            ("replica", "instance", "job"),
        ),
        Signal(
            "kv_cache_usage_max",
            "highest KV-cache usage (0-1)",
            {"window": W, "by": BY},
            read_engine.gauge(KV_CACHE_USAGE, "max"),
            ("replica",),
        ),
        Signal(
            "kv_cache_usage_avg",
            "mean KV-cache usage (0-1)",
            {"window": W, "by": BY},
            read_engine.gauge(KV_CACHE_USAGE, "avg"),
            ("replica",),
        ),
        Signal(
            "requests_waiting",
            "mean requests waiting in the engine's queue",
            {"window": W, "by": BY},
            read_engine.gauge(REQUESTS_WAITING, "avg"),
            ("replica",),
        ),
        Signal(
            "waiting_growth",
            "mean queue in the window's second half minus its first half",
            {"window": Param("10m"), "by": BY},
            read_engine.waiting_growth,
            ("replica",),
        ),
        Signal(
            "preemption_rate", "preemptions per second", {"window": W5, "by": BY}, read_engine.preemptions, ("replica",)
        ),
        Signal(
            "engine_stalled",
            "seconds a replica has held requests (running or waiting) without generating a token, "
            "while it is stalled (looked for in the window)",
            {"window": Param("10m")},
            read_engine.stalled,
            ("replica", "model"),
        ),
        Signal(
            "ttft_p99",
            "p99 time to first token (s), engine histograms",
            {"window": W5, "by": BY_MODEL},
            read_slo.quantile("ttft", 0.99),
            ("model",),
        ),
        Signal(
            "itl_p99",
            "p99 inter-token latency (s), engine histograms",
            {"window": W5, "by": BY_MODEL},
            read_slo.quantile("itl", 0.99),
            ("model",),
        ),
        Signal(
            "latency_quantile",
            "a latency quantile (s), engine histograms",
            {
                "window": W5,
                "by": BY_MODEL,
                "metric": Param("ttft", "choice", ("ttft", "itl", "tpot", "e2e", "queue")),
                "q": Param("0.99", "number"),
            },
            read_slo.quantile(None, None),
            ("model",),
        ),
        Signal(
            "latency_over_slo",
            "observed percentile / SLO threshold per model (> 1: over the SLO); none until the window "
            "holds enough requests for the percentile",
            {
                "window": W5,
                "metric": Param("ttft", "choice", ("ttft", "itl", "tpot", "e2e")),
                "min_requests": Param(
                    "0",
                    "number",
                    help="requests the window must hold; 0: 1 / (1 - percentile), 100 for a p99",
                ),
            },
            read_slo.over_slo,
            ("model", "metric", "slo"),
        ),
        Signal(
            "slo_burn_rate",
            "error-budget burn rate, the lower of the long and the short window; none until the data "
            "covers min_coverage of the long window",
            {
                "window": Param("1h"),
                "short": W5,
                "min_coverage": Param(
                    "0.5", "number", help="share of the long window the data must cover (0-1); $extra.coverage"
                ),
                "metric": Param("any", "choice", ("any", "ttft", "itl", "tpot", "e2e")),
            },
            read_slo.burn,
            ("model", "metric", "slo"),
        ),
        Signal(
            "error_ratio",
            "share of requests that failed on the server side (request log)",
            {"window": W5, "by": BY_MODEL},
            read_requests.errors,
            ("model",),
        ),
        Signal(
            "shed_ratio",
            "share of requests the gateway shed on purpose (queue-time budget, tenant share): admission, "
            "not failure; $extra.queue_time, $extra.tenant_share (each reason's share), $extra.requests",
            {"window": W5, "by": Param("model", "choice", ("model", "tenant"), "group by model or tenant")},
            read_requests.shed_ratio,
            ("model",),
        ),
        Signal(
            "cost_per_mtok",
            "USD per 1M tokens",
            {"window": Param("1h"), "by": BY_MODEL},
            read_cost.cost_per_mtok,
            ("model",),
        ),
        Signal(
            "cost_per_mtok_change",
            "percent change of USD per 1M tokens against the same window `offset` earlier",
            {"window": Param("1h"), "by": BY_MODEL, "offset": Param("7d")},
            read_cost.cost_change,
            ("model",),
        ),
        Signal(
            "cost_per_mtok_jump",
            "percent change of USD per 1M tokens: the last `window` against the `baseline` just before it "
            "(fires within the hour on a young fleet)",
            {"window": Param("15m"), "baseline": Param("1h"), "by": Param("model", "choice", ("model", "tenant"))},
            read_cost.cost_jump,
            ("model",),
        ),
        Signal(
            "draft_acceptance",
            "speculative decoding: accepted / proposed draft tokens (0-1), replicas that draft",
            {"window": W5, "by": BY, "min_draft_tokens": MIN_DRAFTS},
            read_engine.draft_acceptance,
            ("replica",),
        ),
        Signal(
            "draft_acceptance_drop",
            "speculative decoding: the acceptance rate of the `baseline` before the window minus the "
            "window's (0-1); $extra.before and $extra.after",
            {"window": Param("10m"), "baseline": Param("1h"), "by": BY, "min_draft_tokens": MIN_DRAFTS},
            read_engine.acceptance_drop,
            ("replica",),
        ),
        Signal(
            "requests_deferred",
            "LoRA: mean requests a replica held back for an adapter slot (vLLM's waiting reason 'deferred')",
            {"window": W5},
            read_engine.deferred,
            ("replica",),
        ),
        Signal(
            "adapter_waiting",
            "LoRA: share of a replica's scrape intervals in which requests for the adapter waited for an "
            "adapter slot (every slot running another adapter)",
            {"window": W5},
            read_engine.adapter_waiting,
            ("replica", "adapter"),
        ),
        Signal(
            "drift_share",
            "share of request features that drifted against the reference (0-1)",
            {"window": Param("1h"), "reference": Param("trailing-day", "choice", ("trailing-day", "last-week"))},
            read_requests.drift_share,
            (),
        ),
        Signal(
            "refusal_rate",
            "quality: share of the evaluated answers that were refusals (0-1), weighted; $extra.evaluated, "
            "$extra.requests",
            {"window": Param("10m"), "by": BY_ANSWERS, "min_evaluated": MIN_EVALUATED},
            read_quality.rate("refusal_rate"),
            ("model",),
        ),
        Signal(
            "truncation_rate",
            "quality: share of the evaluated answers cut at max_tokens (finish reason 'length', 0-1), weighted; "
            "$extra.evaluated, $extra.requests",
            {"window": Param("10m"), "by": BY_ANSWERS, "min_evaluated": MIN_EVALUATED},
            read_quality.rate("truncation_rate"),
            ("model",),
        ),
        Signal(
            "router_agreement",
            "router audit: mean word agreement (F1, 0-1) of the routed and the shadow answer per route reason and "
            "direction; $extra.audits, $extra.low (share below 0.5), $extra.quality_gap (judge, shadow - routed)",
            {"window": Param("1h"), "min_audits": Param("20", "number", help="audits the window must hold")},
            read_quality.agreement,
            ("route_reason", "direction"),
        ),
        Signal(
            "pool_at_max",
            "autoscaling: 1 while the pool's last decision in the window is held_at_max (it wanted more "
            "replicas at max_replicas; no scale-in since), else 0; $extra.replicas",
            {"window": Param("6h")},
            read_scaling.pool_at_max,
            ("model",),
        ),
        Signal(
            "scale_flapping",
            "autoscaling: direction changes (a scale-out after a scale-in or the reverse) within the window",
            {"window": Param("30m")},
            read_scaling.scale_flapping,
            ("model",),
        ),
        Signal(
            "scale_out_lag_seconds",
            "autoscaling: the latest scale-out's signal crossing -> its replica's first token (s), or -> now "
            "while it does not serve yet; $extra.time_to_ready",
            {"window": Param("1h")},
            read_scaling.scale_out_lag,
            ("model",),
        ),
        Signal(
            "spend_per_hour_change",
            "percent change of the spend per hour (uptime x GPUs x price): the last `window` against the "
            "`baseline` before it, per pool or for the fleet; $extra.before, $extra.after (USD/h)",
            {"window": Param("5m"), "baseline": Param("1h"), "by": Param("model", "choice", ("model", "fleet"))},
            read_scaling.spend_per_hour_change,
            ("model",),
        ),
    )
}
