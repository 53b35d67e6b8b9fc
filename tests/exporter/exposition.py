"""What a scrape of the exporter reads: a registry holding only ``exporter.expose.Figures``,
rendered by prometheus_client and parsed back by its own parser (as Prometheus would read it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.expose import register
from exporter.refresh import Refresher

Key = tuple[str, frozenset[tuple[str, str]]]


def text(refresher: Refresher) -> str:
    registry = CollectorRegistry()
    register(registry, refresher)
    return generate_latest(registry).decode()


def samples(body: str) -> dict[Key, float]:
    """(sample name, labels) -> value of every sample in ``body``."""
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def of(found: dict[Key, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one name, by their labels."""
    return {labels: value for (n, labels), value in found.items() if n == name}


def key(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())
