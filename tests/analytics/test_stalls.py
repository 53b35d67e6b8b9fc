"""Stalled engines on the simulated fleet (stored through the collector's path): the replica the
``engine-stall`` scenario freezes is named, from when to when, and nothing else is, even a cache
saturated by a long-context rollout; the advice and ``explain`` name it too."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.explain import explain
from analytics.saturation import Targets, recommend, scale_out
from analytics.stalls import episodes, stalls
from tests.analytics.scenario_data import play

STALL_AT, RESUME_AT = 180, 540  # fleet/scenarios/engine-stall.yaml


@pytest.fixture(scope="module")
def run(chdb_dir):
    return play(chdb_dir, "engine-stall", seed=1)


def test_the_frozen_replica_is_named_from_its_freeze_to_its_resume(run) -> None:
    frozen, resumed = run.start + timedelta(seconds=STALL_AT), run.start + timedelta(seconds=RESUME_AT)
    found = stalls(run.client, run.start, run.end)
    step = timedelta(seconds=found.attrs["step"])
    assert list(found["replica"]) == ["small-1"] and found.loc[0, "model"] == "tiny-small"
    assert frozen <= found.loc[0, "since"] <= frozen + 2 * step  # the first step with no token at all
    assert abs(found.loc[0, "until"] - resumed) <= step and not found.loc[0, "ongoing"]
    assert found.loc[0, "requests"] >= 1
    # a window that ends during the stall: still going on, as long as the window has lasted
    during = stalls(run.client, run.start, frozen + timedelta(minutes=4))
    assert list(during["replica"]) == ["small-1"] and bool(during.loc[0, "ongoing"])
    assert during.loc[0, "seconds"] == pytest.approx(240, abs=2 * step.total_seconds())
    assert stalls(run.client, run.start, frozen).empty  # before it: nothing


def test_episodes_join_stalled_steps_across_short_gaps_and_end_at_a_step_with_tokens() -> None:
    t0 = pd.Timestamp("2026-12-01 00:00", tz="UTC")

    def at(minutes: float) -> pd.Timestamp:
        return t0 + pd.Timedelta(minutes=minutes)

    rows = [  # (minute, replica, requests held, stalled) on 1-minute steps
        *[(m, "a", 2, False) for m in range(0, 3)],
        (3, "a", 2, True),
        (4, "a", 3, True),
        (7, "a", 1, True),  # two steps without samples (5, 6): the same stall goes on
        (8, "a", 2, False),  # tokens again: it ends
        (12, "a", 4, True),  # four steps without samples: a new one, which reaches the window's end
        (0, "b", 1, True),
        (1, "b", 1, True),
        (2, "b", 0, False),
        (3, "b", 5, True),  # alone, a minute long
        (4, "b", 5, False),
    ]
    steps = pd.DataFrame(
        [(at(m), r, "m", float(n), stalled) for m, r, n, stalled in rows],
        columns=["ts", "replica", "model", "requests", "stalled"],
    )
    steps.attrs.update(step=60, end=at(13).to_pydatetime())
    found = episodes(steps.sample(frac=1, random_state=3))  # any order of rows
    got = {(r.replica, r.since, r.until, r.seconds, r.requests, r.ongoing) for r in found.itertuples()}
    assert got == {
        ("a", at(3), at(8), 300.0, 3, False),
        ("a", at(12), at(13), 60.0, 4, True),
        ("b", at(0), at(2), 120.0, 1, False),
        ("b", at(3), at(4), 60.0, 5, False),
    }
    assert list(found["seconds"]) == [300.0, 120.0, 60.0, 60.0]  # longest first, then by replica
    assert list(episodes(steps, min_seconds=120)["seconds"]) == [300.0, 120.0]
    assert episodes(steps[~steps["stalled"]]).empty


def test_a_saturated_cache_is_not_a_stall(chdb_dir) -> None:
    rollout = play(chdb_dir, "long-context-rollout", seed=1)
    # requests wait and are preempted, the cache is full in waves, tokens still flow: no replica is named
    assert stalls(rollout.client, rollout.start, rollout.end).empty


def test_the_advice_names_the_stalled_replica(run) -> None:
    frozen = run.start + timedelta(seconds=STALL_AT)
    plan = scale_out(run.client, frozen - timedelta(minutes=10), frozen + timedelta(minutes=4)).set_index("model")
    small = plan.loc["tiny-small"]
    assert small["stalled"] == ["small-1"] and "small-1" in small["reasons"][0] and "stalled" in small["reasons"][0]
    assert not any(r.startswith("no action") for r in small["reasons"])
    assert plan.loc["tiny-large", "reasons"][0].startswith("no action")


def test_explain_puts_a_stall_first_and_names_the_replica(run) -> None:
    ex = explain(run.client, run.start, run.end)
    top = ex.evidence.iloc[0]
    assert top["signal"] == "stalled replicas" and "small-1" in top["detail"]
    assert "stalled replicas" in ex.sentence


def pool(**row: object) -> pd.DataFrame:
    base = {
        "model": "m",
        "replicas": 10,
        "kv_recent": 0.24,
        "kv_max_recent": 1.0,
        "waiting_per_replica": 0.2,
        "preemptions_per_s": 0.0,
        "ttft_p99_recent": 0.5,
        "ttft_p99_before": 0.5,
        "headroom": 0.7,
        "saturated": [],
        "stalled": [],
    }
    return pd.DataFrame([base | row])


def test_a_pool_average_never_hides_single_replicas() -> None:
    # the case from the field: a pool at 24 % on average, with replicas at 100 % and queueing, or frozen
    calm = recommend(pool()).iloc[0]
    assert calm["reasons"][0].startswith("no action") and calm["attention"] == []
    hot = recommend(pool(saturated=["r3", "r7"])).iloc[0]
    assert not any(r.startswith("no action") for r in hot["reasons"]) and hot["attention"] == ["r3", "r7"]
    assert "2 of 10 replicas" in hot["reasons"][0] and "r3, r7" in hot["reasons"][0]
    many = [f"r{i}" for i in range(8)]
    frozen = recommend(pool(stalled=many, saturated=["r0", "r9"])).iloc[0]
    assert frozen["reasons"][0].startswith("8 of 10 replicas stalled (r0, r1, r2, r3, r4 and 3 more)")
    assert "1 of 10 replicas at >= 90%" in frozen["reasons"][1]  # r9 alone: r0 is counted as stalled


def test_a_quiet_pool_of_several_is_told_it_could_shrink() -> None:
    plan = recommend(pool(replicas=3, kv_recent=0.1, waiting_per_replica=0.0), Targets()).iloc[0]
    assert (plan["replicas"], plan["recommended"]) == (3, 2)
    assert "2 replicas would run at about 15%" in plan["reasons"][0]
