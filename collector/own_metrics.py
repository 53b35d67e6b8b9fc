"""The collector's own Prometheus metrics (what it scraped, received, refused), served on its ``/metrics``.

In:  the registry the collector serves, and how many targets it scrapes now.
Out: ``CollectorMetrics``: the counters and gauges ``collector.service`` updates (the writer's
     own are in ``collector.writer``; docs/collector.md lists them all).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["CollectorMetrics"]


class CollectorMetrics:
    """The collector's own counters and gauges, on its registry."""

    def __init__(self, registry: CollectorRegistry, targets: Callable[[], int]) -> None:
        self.scrapes = Counter("fleetscope_collector_scrapes_total", "Scrapes", ["job", "result"], registry=registry)
        self.samples = Counter("fleetscope_collector_samples_total", "Samples scraped", registry=registry)
        self.spans = Counter("fleetscope_collector_spans_total", "OTLP spans received", ["kind"], registry=registry)
        self.requests = Counter(
            "fleetscope_collector_request_rows_total", "Request rows", ["source", "result"], registry=registry
        )
        self.bad_bodies = Counter(
            "fleetscope_collector_bad_bodies_total", "Bodies refused", ["endpoint"], registry=registry
        )
        self.gateway_records = Counter(
            "fleetscope_collector_gateway_records_total",
            "Other gateways' request records, by what became of them (mapped, unmapped, rejected)",
            ["endpoint", "result"],
            registry=registry,
        )
        self.remote_write = Counter(
            "fleetscope_collector_remote_write_requests_total",
            "Remote-write requests, by answer: ok (stored), refused (4xx: a bad body), busy (503: retried later)",
            ["result"],
            registry=registry,
        )
        self.remote_samples = Counter(
            "fleetscope_collector_remote_write_samples_total",
            "Remote-write samples, by what became of them (kept, scrape, stale, duplicate, out_of_bounds, "
            "native_histogram)",
            ["result"],
            registry=registry,
        )
        self.remote_newest = Gauge(
            "fleetscope_collector_remote_write_newest_sample_timestamp_seconds",
            "The newest sample time a remote-write sender has delivered, per job (time() minus it: the delay)",
            ["job"],
            registry=registry,
        )
        self.targets = Gauge("fleetscope_collector_targets", "Scrape targets", registry=registry)
        self.targets.set_function(targets)
