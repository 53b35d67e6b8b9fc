"""Speculative decoding and LoRA adapters on the simulated fleet (fleet-spec-lora.yaml): the two
incident scenarios played in virtual time and stored as the collector stores a live fleet, then
read back through analytics and explained.

- acceptance-collapse: the spec-decode replica's drafts go from mostly accepted to almost never
  at 300 s; ``explain --latency itl`` must put the draft acceptance first, its break within two
  steps of the switch.
- adapter-thrash: four adapters on one replica with one adapter slot take off at 300 s;
  ``explain`` (p99 TTFT) must put adapter waiting first, its break within two steps.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from analytics.adapters import adapter_names, adapter_traffic, blocked_over_time, residency
from analytics.explain import explain
from analytics.specdecode import acceptance, acceptance_over_time, by_position
from tests.analytics.scenario_data import Run, play

SPEC = "fleet-spec-lora.yaml"
ADAPTERS = ["code-bot", "legal-bot", "sql-bot", "support-bot"]


@pytest.fixture(scope="module")
def collapse(chdb_dir) -> Run:
    return play(chdb_dir, "acceptance-collapse", seed=1, spec=SPEC)


@pytest.fixture(scope="module")
def thrash(chdb_dir) -> Run:
    return play(chdb_dir, "adapter-thrash", seed=1, spec=SPEC)


def _evidence(ex) -> str:
    return ex.evidence[["signal", "before", "after", "score", "moved_at", "lead_s"]].to_string()


def test_acceptance_falls_when_the_prompts_stop_being_predictable(collapse: Run) -> None:
    switch = collapse.phase("free-form-prompts")
    before = acceptance(collapse.client, collapse.start, switch, "replica").set_index("replica")
    after = acceptance(collapse.client, switch, collapse.end, "replica").set_index("replica")
    assert list(before.index) == ["spec-0"]  # only the replica with a speculative config drafts
    b, a = before.loc["spec-0"], after.loc["spec-0"]
    assert b["drafts"] > 0 and b["k"] == 3
    assert b["acceptance_rate"] > 0.45 > 0.15 > a["acceptance_rate"]
    assert b["mean_accepted_length"] > 2.5 and a["mean_accepted_length"] < 1.5
    assert b["speedup"] > 2 > 1.5 > a["speedup"]
    assert 0 < a["draft_efficiency"] < b["draft_efficiency"] <= 1
    positions = by_position(collapse.client, collapse.start, switch, "replica")
    rates = positions["rate"].tolist()
    assert positions["position"].tolist() == [0, 1, 2]
    assert rates[0] > rates[1] > rates[2] > 0  # a later draft token counts only after the earlier ones
    series = acceptance_over_time(collapse.client, collapse.start, collapse.end, step=60)
    early = series[series["ts"] < switch]["acceptance_rate"].dropna()
    late = series[series["ts"] >= switch + timedelta(minutes=1)]["acceptance_rate"].dropna()
    assert len(early) >= 4 and len(late) >= 4
    assert early.min() > late.max()


def test_explain_puts_an_itl_regression_down_to_the_acceptance_collapse(collapse: Run) -> None:
    ex = explain(collapse.client, collapse.start, collapse.end, latency="itl")
    switch = collapse.phase("free-form-prompts")
    assert ex.break_at is not None, ex.sentence
    assert ex.evidence["signal"].iloc[0] == "draft acceptance", _evidence(ex)
    assert abs((ex.break_at - switch).total_seconds()) <= 2 * ex.request_step, (ex.break_at, switch)
    assert ex.after > 1.5 * ex.before
    assert "draft acceptance" in ex.sentence


def test_adapters_wait_for_a_slot_once_more_of_them_are_wanted_than_slots(thrash: Run) -> None:
    switch = thrash.phase("adapters-take-off")
    assert adapter_names(thrash.client, thrash.start, thrash.end) == ADAPTERS
    before = residency(thrash.client, thrash.start, switch).set_index("adapter")
    after = residency(thrash.client, switch, thrash.end).set_index("adapter")
    assert set(after["replica"]) == {"small-0"}  # the one replica that serves them
    assert after["blocked_share"].min() > 0.2
    assert before["blocked_share"].max() < after["blocked_share"].min()
    assert (after["resident_share"] > before.reindex(after.index)["resident_share"].fillna(0)).all()
    steps = blocked_over_time(thrash.client, thrash.start, thrash.end, 60)
    assert steps[steps["ts"] >= switch]["blocked"].mean() > 3 * steps[steps["ts"] < switch]["blocked"].mean()
    traffic = adapter_traffic(thrash.client, switch, thrash.end, ADAPTERS).set_index("model")
    assert list(traffic.index) == ADAPTERS and (traffic["requests"] > 50).all()
    base = adapter_traffic(thrash.client, switch, thrash.end, ["tiny-small"])  # not an adapter name here
    assert base.empty is False and base["ttft_p99"].iloc[0] < traffic["ttft_p99"].min()


def test_explain_puts_a_ttft_regression_down_to_adapter_waiting(thrash: Run) -> None:
    ex = explain(thrash.client, thrash.start, thrash.end)
    switch = thrash.phase("adapters-take-off")
    assert ex.break_at is not None, ex.sentence
    assert ex.evidence["signal"].iloc[0] == "adapter waiting", _evidence(ex)
    assert abs((ex.break_at - switch).total_seconds()) <= 2 * ex.request_step, (ex.break_at, switch)
    detail = ex.evidence["detail"].iloc[0]
    assert "max_loras 1" in detail and any(name in detail for name in ADAPTERS)
