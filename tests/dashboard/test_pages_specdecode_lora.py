"""The pages where speculative decoding and LoRA adapters show, under Streamlit's AppTest, on the
two simulated incidents of fleet-spec-lora.yaml: Latency shows the draft acceptance, Cache &
capacity the adapters' residency and waiting, Cost the spend per adapter, each with the numbers
``analytics`` gives for the same view, in tables that read like a product; on a fleet without
either (tenant-shift on fleet.yaml) the sections are not drawn."""

from __future__ import annotations

import pytest

from analytics.adapters import residency
from analytics.cost import cost_by_adapter
from analytics.specdecode import acceptance
from dashboard.context import use_stores
from dashboard.format import label
from dashboard.view import read_view
from storage.catalog import gpu_prices
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions
from tests.dashboard.apptest import on_store, run, window
from tests.dashboard.test_tables import walk

SPEC = "fleet-spec-lora.yaml"
ADAPTER = label("adapter")


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


@pytest.fixture(scope="module")
def collapse(chdb_dir):
    return play(chdb_dir, "acceptance-collapse", seed=1, spec=SPEC)


@pytest.fixture(scope="module")
def thrash(chdb_dir):
    return play(chdb_dir, "adapter-thrash", seed=1, spec=SPEC)


def _subheaders(at) -> list[str]:
    return [h.value for h in at.subheader]


def test_latency_shows_the_draft_acceptance_analytics_reads(collapse, sessions, chdb_dir) -> None:
    use_stores(collapse.client, sessions, on_store(chdb_dir))
    at = run("latency", **window(collapse))
    assert not at.exception, at.exception
    assert "Speculative decoding" in _subheaders(at)
    view = read_view(window(collapse))
    spec = acceptance(collapse.client, view.start, view.end, "replica")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Draft acceptance"] == f"{spec['accepted'].sum() / spec['draft_tokens'].sum():.0%}"
    assert metrics["Tokens per decode step"] == f"{1 + spec['accepted'].sum() / spec['drafts'].sum():.2f}"
    shown = [t.value for t in at.dataframe]
    assert list(shown[-1][label("replica")]) == ["spec-0"]
    assert label("acceptance_rate") in shown[-1].columns
    seen: dict[str, list[str]] = {}
    walk(at, "latency", seen)
    assert not seen, seen


def test_capacity_and_cost_show_each_adapter(thrash, sessions, chdb_dir) -> None:
    use_stores(thrash.client, sessions, on_store(chdb_dir))
    view = read_view(window(thrash))
    at = run("capacity", **window(thrash))
    assert not at.exception, at.exception
    assert "LoRA adapters" in _subheaders(at)
    found = residency(thrash.client, view.start, view.end).set_index("adapter")
    table = next(t.value for t in at.dataframe if ADAPTER in t.value.columns).set_index(ADAPTER)
    assert sorted(table.index) == ["code-bot", "legal-bot", "sql-bot", "support-bot"]
    blocked = table[label("blocked_share")] - found.loc[table.index, "blocked_share"]
    assert blocked.abs().max() < 1e-3  # the table keeps 4 significant digits
    assert (table[label("ttft_p99")] > 0).all()
    seen: dict[str, list[str]] = {}
    walk(at, "capacity", seen)

    at = run("cost", **window(thrash))
    assert not at.exception, at.exception
    assert "Spend per LoRA adapter" in _subheaders(at)
    costs = cost_by_adapter(thrash.client, view.start, view.end, gpu_prices(sessions)).set_index("adapter")
    shown = next(t.value for t in at.dataframe if ADAPTER in t.value.columns).set_index(ADAPTER)
    assert sorted(shown.index) == sorted(costs.index)
    spend = shown[label("spend")] / costs.loc[shown.index, "spend"] - 1
    assert spend.abs().max() < 1e-3
    walk(at, "cost", seen)
    assert not seen, seen


def test_a_fleet_without_drafts_or_adapters_draws_neither_section(chdb_dir, sessions) -> None:
    shift = play(chdb_dir, "steady", seed=2)
    use_stores(shift.client, sessions, on_store(chdb_dir))
    assert "Speculative decoding" not in _subheaders(run("latency", **window(shift)))
    assert "LoRA adapters" not in _subheaders(run("capacity", **window(shift)))
    assert "Spend per LoRA adapter" not in _subheaders(run("cost", **window(shift)))
