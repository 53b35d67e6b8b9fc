"""The exporter on a Prometheus registry: the refresher's last snapshot as metric families.

In:  a ``Refresher`` (``exporter.refresh``).
Out: ``Figures``, a prometheus_client custom collector: ``collect()`` yields every family of
     ``exporter.families.FAMILIES`` from the last snapshot (a figure never read yet, or without
     data, has a family without samples), the exporter's own metrics included. It reads the
     snapshot and builds families: no query, so a scrape on the collector's event loop does not
     wait for the store. ``register(registry, refresher)`` adds it to a registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.families import FAMILIES, Family
from exporter.read import windows
from exporter.refresh import Refresher

__all__ = ["Figures", "register"]


def _family(f: Family) -> GaugeMetricFamily | CounterMetricFamily:
    if f.kind == "counter":
        return CounterMetricFamily(f.name, f.help, labels=list(f.labels), unit=f.unit)
    return GaugeMetricFamily(f.name, f.help, labels=list(f.labels), unit=f.unit)


class Figures:
    """fleetscope's numbers, as the last refresh read them."""

    def __init__(self, refresher: Refresher) -> None:
        self.refresher = refresher

    def describe(self) -> Iterable[Metric]:
        """The families without samples (the registry learns the names without a collect)."""
        return [_family(f) for f in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        snap = self.refresher.snapshot
        families = {f.name: _family(f) for f in FAMILIES}
        for reading in snap.readings.values():
            for s in reading.samples:
                families[s.family].add_metric(list(s.labels), s.value)
        if snap.at is not None:
            families["fleetscope_exporter_last_refresh_timestamp_seconds"].add_metric([], snap.at.timestamp())
        if snap.duration_s is not None:
            families["fleetscope_exporter_refresh_duration_seconds"].add_metric([], snap.duration_s)
        for figure, reading in snap.readings.items():
            families["fleetscope_exporter_figure_timestamp_seconds"].add_metric([figure], reading.at.timestamp())
        for figure, span in windows(self.refresher.params).items():
            if figure in self.refresher.figures:
                families["fleetscope_exporter_window_seconds"].add_metric([figure], span.total_seconds())
        families["fleetscope_exporter_refreshes_total"].add_metric([], snap.refreshes)
        for figure in self.refresher.figures:  # every figure, 0 included: a rate() has a series to start from
            families["fleetscope_exporter_refresh_errors_total"].add_metric([figure], snap.errors.get(figure, 0))
        yield from families.values()


def register(registry: CollectorRegistry, refresher: Refresher) -> Figures:
    """Serve ``refresher``'s numbers on ``registry`` (e.g. the collector's, for its ``GET /metrics``)."""
    figures = Figures(refresher)
    registry.register(figures)
    return figures
