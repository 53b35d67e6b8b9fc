"""Saturation and the scale-out recommendation on a long-context rollout of the simulated fleet:
the small pool fills its KV cache, queues and preempts during the rollout and is told to grow;
after the rollback it is told it could shrink; the large pool is left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from analytics.filters import Filters
from analytics.saturation import Targets, headroom, saturation, saturation_over_time, scale_out
from tests.analytics.scenario_data import play


@pytest.fixture(scope="module")
def run(chdb_dir):
    return play(chdb_dir, "long-context-rollout", seed=1)


def windows(run):
    rollout = run.phase("rollout")
    return (run.start, rollout), (rollout + timedelta(minutes=1), run.phase("rollback"))


def test_the_rollout_saturates_the_small_replicas(run) -> None:
    steady, incident = windows(run)
    before = saturation(run.client, *steady, "model").set_index("model")
    during = saturation(run.client, *incident, "model").set_index("model")
    small_b, small_d = before.loc["tiny-small"], during.loc["tiny-small"]
    assert small_d["kv_avg"] > 2 * small_b["kv_avg"] and small_d["kv_max"] == pytest.approx(1.0)
    assert small_d["waiting_avg"] > small_b["waiting_avg"]
    # a cache that holds one long request: a rare long one preempts in the steady phase too, the rollout many
    # (3.6x as many in the seeded run; 5x before the first burst moved a minute in)
    assert small_d["preemptions_per_s"] > 3 * small_b["preemptions_per_s"]
    assert (small_d["replicas"], during.loc["tiny-large", "replicas"]) == (2, 1)
    per_replica = saturation(run.client, *incident, "replica", filters=Filters(model="tiny-small"))
    assert list(per_replica["replica"]) == ["small-0", "small-1"]
    assert 0 < small_d["prefix_hit_rate"] < 1 and small_d["iteration_tokens_avg"] > 1


def test_over_time_agrees_with_the_window_summary(run) -> None:
    _steady, incident = windows(run)
    start = incident[0].replace(second=0)
    end = start + timedelta(minutes=4)
    steps = saturation_over_time(run.client, start, end, "replica", step=60)
    summary = saturation(run.client, start, end, "replica").set_index("replica")
    for replica, frame in steps.groupby("replica"):
        assert len(frame) == 4
        # every step holds the same number of scrapes, so the mean of step means is the mean
        assert frame["kv_avg"].mean() == pytest.approx(summary.loc[replica, "kv_avg"], rel=1e-6)
        assert frame["kv_max"].max() == pytest.approx(summary.loc[replica, "kv_max"])
        assert frame["preemptions_per_s"].mean() == pytest.approx(summary.loc[replica, "preemptions_per_s"], rel=1e-6)
    by_model = saturation_over_time(run.client, start, end, "model", step=60)
    assert set(by_model.loc[by_model["model"] == "tiny-small", "replicas_up"]) == {2}


def test_scale_out_during_the_rollout_and_in_after_it(run) -> None:
    rollout, rollback = run.phase("rollout"), run.phase("rollback")
    during = scale_out(run.client, rollout - timedelta(minutes=3), rollout + timedelta(minutes=5)).set_index("model")
    small = during.loc["tiny-small"]
    assert small["recommended"] > small["replicas"] == 2
    assert any("waiting" in r or "KV cache" in r for r in small["reasons"])
    assert during.loc["tiny-large", "change"] == 0 and during.loc["tiny-large", "reasons"][0].startswith("no action")
    after = scale_out(run.client, rollback + timedelta(minutes=1), run.end).set_index("model")
    # the cache drained: no more replicas asked for; a rare long prompt still preempts in a cache that
    # holds one, so the pool is not told to shrink either, and the advice says why
    assert after.loc["tiny-small", "change"] == 0 and after.loc["tiny-small", "kv_recent"] < 0.3
    assert any("preemptions per minute" in r for r in after.loc["tiny-small", "reasons"])
    strict = scale_out(run.client, rollback + timedelta(minutes=1), run.end, targets=Targets(kv_target=0.05))
    assert strict.set_index("model").loc["tiny-small", "change"] > 0  # the same load is "too full" for a 5 % target


def test_headroom_is_the_distance_to_the_kv_target(run) -> None:
    rollout = run.phase("rollout")
    start, end = rollout - timedelta(minutes=3), rollout + timedelta(minutes=5)
    room = headroom(run.client, start, end).set_index("model")
    recent = end - (end - start) / 4
    kv = run.client.query(  # the small pool's mean KV usage over the last quarter, read with plain SQL
        "SELECT avg(value) FROM samples WHERE metric = 'vllm:kv_cache_usage_perc' AND ts >= {a:DateTime64(3)} "
        "AND ts < {b:DateTime64(3)} AND fingerprint IN (SELECT fingerprint FROM series WHERE model = 'tiny-small')",
        parameters={"a": recent, "b": end},
    ).result_rows[0][0]
    assert room.loc["tiny-small", "kv_recent"] == pytest.approx(kv)
    assert room.loc["tiny-small", "headroom"] == pytest.approx(1 - kv / 0.8)
    assert room.loc["tiny-small", "headroom"] < room.loc["tiny-large", "headroom"]
    # the pools' figures, summed from the replicas' read, are what reading by pool gives
    for tier in ("raw", "1m"):
        pools = headroom(run.client, start, end, tier=tier).set_index("model")
        by_pool = saturation(run.client, end - (end - start) / 4, end, "model", tier=tier).set_index("model")
        for ours, theirs in (
            ("kv_recent", "kv_avg"),
            ("kv_max_recent", "kv_max"),
            ("waiting_per_replica", "waiting_avg"),
            ("preemptions_per_s", "preemptions_per_s"),
            ("replicas", "replicas"),
        ):
            assert pools[ours].to_dict() == pytest.approx(by_pool.loc[pools.index, theirs].to_dict()), (tier, ours)


def test_a_filter_that_matches_nothing_gives_empty_answers(run) -> None:
    steady, _incident = windows(run)
    nobody = Filters(model="no-such-model")
    for by in ("model", "replica"):
        assert saturation(run.client, *steady, by, filters=nobody).empty
        steps = saturation_over_time(run.client, *steady, by, step=60, filters=nobody)
        assert steps.empty and {"ts", by, "kv_avg", "replicas_up"} <= set(steps.columns)
