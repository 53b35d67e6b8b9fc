"""The exporter's names, units, types and labels follow Prometheus's conventions, checked three
ways: on the definitions (``exporter.families.FAMILIES``), on a real scrape of a seeded store
read back by prometheus_client's parsers (text and OpenMetrics, which checks each unit against its
name), and by ``promtool check metrics``, Prometheus's own linter."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from exporter.expose import register
from exporter.families import FAMILIES, FIGURES
from exporter.read import READERS, Params, Stores
from exporter.refresh import Refresher
from tests.exporter.conftest import stall_at
from tests.exporter.exposition import text
from tests.promtools import binary

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
UNITS = {"seconds", "ratio", "usd_per_hour", "usd_per_million_tokens"}  # base units, or the money rates asked for


@pytest.fixture(scope="module")
def refresher(stall, sessions) -> Refresher:
    at = stall_at(stall)
    made = Refresher(lambda: Stores(stall.client, sessions), Params(), clock=lambda: at)
    assert not made.refresh()
    return made


def test_the_definitions_follow_the_naming_conventions() -> None:
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    for f in FAMILIES:
        assert f.name.startswith("fleetscope_") and SNAKE.match(f.name), f.name
        assert f.kind in ("gauge", "counter"), f.name
        assert f.name.endswith("_total") == (f.kind == "counter"), f"{f.name}: counters and only counters end in _total"
        assert f.unit in UNITS | {""}, f.name
        if f.unit:
            assert f.name.endswith("_" + f.unit), f.name
        for unit in UNITS:  # a name that says a unit declares it
            assert not f.name.endswith("_" + unit) or f.unit == unit, f.name
        assert not re.search(r"_(ms|milliseconds|minutes|hours|percent|sec|s)$", f.name), f"{f.name}: not a base unit"
        assert len(f.help) > 20, f.name
        assert all(SNAKE.match(label) and label not in ("le", "quantile") for label in f.labels), f.name
        assert f.figure in (*FIGURES, "exporter"), f.name
    assert tuple(READERS) == FIGURES


def test_a_scrape_holds_every_family_with_its_type_help_and_labels(refresher) -> None:
    by_name = {f.name: f for f in FAMILIES}
    seen = set()
    for family in text_string_to_metric_families(text(refresher)):
        name = family.name + ("_total" if family.type == "counter" else "")
        f = by_name[name]
        seen.add(name)
        assert family.type == f.kind and family.documentation == f.help
        for s in family.samples:
            assert s.name == name and set(s.labels) == set(f.labels), s
    assert seen == set(by_name)


def test_the_openmetrics_rendering_declares_each_unit(refresher) -> None:
    registry = CollectorRegistry()
    register(registry, refresher)
    units = {family.name: family.unit for family in parse_openmetrics(openmetrics_latest(registry).decode())}
    for f in FAMILIES:
        assert units[f.name.removesuffix("_total")] == f.unit, f.name


def test_promtool_finds_nothing_to_say(refresher) -> None:
    body = text(refresher)
    assert "fleetscope_model_cost_usd_per_million_tokens{" in body  # a scrape with its samples, not just names
    done = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=body, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
