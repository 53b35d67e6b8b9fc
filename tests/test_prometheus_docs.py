"""docs/prometheus.md lists every metric /metrics serves, with its type and labels: fleetscope's
numbers as ``exporter.families.FAMILIES`` defines them, and the collector's own health as a
running collector registers them."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from exporter.families import FAMILIES

DOC = Path(__file__).resolve().parents[1] / "docs" / "prometheus.md"
ROW = re.compile(r"^\| `(fleetscope_[a-z_]+)` \| (gauge|counter|histogram) \|(.*)$")


def section(title: str, end: str) -> dict[str, tuple[str, str]]:
    """metric -> (type, the rest of its row) in the doc's section ``title`` up to ``end``."""
    text = DOC.read_text()
    body = text[text.index(title) : text.index(end, text.index(title))]
    return {m[1]: (m[2], m[3]) for line in body.splitlines() if (m := ROW.match(line))}


def test_every_exported_family_is_documented_with_its_type_and_labels() -> None:
    documented = section("## fleetscope's numbers in Prometheus", "### The collector's own health")
    assert set(documented) == {f.name for f in FAMILIES}
    for family in FAMILIES:
        kind, rest = documented[family.name]
        assert kind == family.kind, family.name
        for label in family.labels:
            assert f"`{label}`" in rest.split("|")[1], (family.name, label)


def test_every_collector_health_metric_is_documented(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    writer = Writer(None, WriterConfig(spool_dir=tmp_path / "spool"), registry=registry)
    Collector(CollectorConfig(grpc_port=0), writer, registry)
    kinds = {m.name + ("_total" if m.type == "counter" else ""): m.type for m in registry.collect()}
    documented = section("### The collector's own health", "```promql")
    assert set(documented) == set(kinds)
    assert all(documented[name][0] == kind for name, kind in kinds.items())
