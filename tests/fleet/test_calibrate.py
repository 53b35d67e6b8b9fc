"""``fleet.calibrate``: the demo's rate and SLO targets from what the engines sustain.

The arithmetic on hand-made probe results (which pool decides, the stated utilisation with the
scenario's bursts, the SLO margin and its rounding, too little to tell), and the probe itself over
HTTP against simulated engines of two speeds (the real-engine run is tests/integration/test_up_engines.py).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from fleet.calibrate import (
    TEMPLATE_TTFT_BOUNDS,
    Calibration,
    CalibrationError,
    Probe,
    cache_limited,
    derive,
    mean_rate,
    peak_rate,
    play,
    played_mix,
    pool_kv_tokens,
    pool_shares,
    probe,
    target_at_bound,
    ttft_bounds,
    with_played_slos,
)
from fleet.rollout import strengthen_rollout
from fleet.sim.engine import EngineConfig
from fleet.sim.server import SimFleet, SimReplica
from fleet.traffic import Scenario, load_scenario


def rollout_mix():
    return load_scenario("long-context-rollout").mix  # 2 req/s, bursts x2.5 for 8 s a minute, 3:1 small:large


def test_the_scenarios_mean_rate_counts_its_bursts_and_its_pools_shares() -> None:
    mix = rollout_mix()
    assert mean_rate(mix) == pytest.approx(2 * (1 + 1.5 * 8 / 60))  # 2.4 req/s on average
    assert peak_rate(mix) == pytest.approx(5.0)  # 2 x 2.5 in a burst
    assert pool_shares(mix) == pytest.approx({"tiny-small": 0.75, "tiny-large": 0.25})


def test_the_pool_that_fills_first_sets_the_rate_and_each_pool_gets_its_own_slo() -> None:
    mix = rollout_mix()
    # in 17 counted seconds the small pool finished 34 requests (2/s), the large one 4 (0.24/s):
    # the mix sends a quarter of its requests to the large pool, so it fills at 0.94 req/s
    probes = [Probe("tiny-small", True, 0.1 + 0.01 * i, 3.0 + i * 0.5) for i in range(34)]
    probes += [Probe("tiny-large", True, 1.2, 3.5 + i * 5.0) for i in range(4)]
    probes += [Probe("tiny-large", True, 2.9, 1.0)]  # before the loops filled: its TTFT counts, its finish does not
    probes += [Probe("tiny-small", False, None, 5.0)]  # a failure is not a finished request
    cal = derive(probes, mix, probe_s=20.0, warm_s=3.0)
    assert cal.pool_rps == pytest.approx({"tiny-small": 34 / 17, "tiny-large": 4 / 17})
    assert cal.sustained_rps == pytest.approx((4 / 17) / 0.25)  # ~0.94 req/s: the large pool decides
    # its bursts (x2.5: 5 req/s in the scenario's terms) at 60 % of that, the mean (2.4) in proportion
    assert cal.peak_rps == pytest.approx(0.6 * (4 / 17) / 0.25)
    assert cal.planned_rps == pytest.approx(0.6 * (4 / 17) / 0.25 * 2.4 / 5)
    assert cal.rate_scale == pytest.approx(0.6 * (4 / 17) / 0.25 / 5)
    # p99 TTFT under full load: 0.43 s (small), 2.9 s (large); x1.5, rounded up to half a second
    assert cal.slo_ttft_s == {"tiny-small": 1.0, "tiny-large": 4.5}
    line = cal.line()
    assert line.startswith(
        "calibrated: engines sustain ~0.94 req/s of the steady mix here; playing at 0.27 req/s (29% of it), "
        "bursts to 0.56 (60%); x0.11 the scenario's rate"
    )
    assert "SLO p99 TTFT <= tiny-large 4.5s, tiny-small 1s" in line


def test_a_mix_without_bursts_plays_its_mean_at_most_30_percent_of_what_the_engines_sustain() -> None:
    # the same probe as above, the scenario without its bursts: at 60 % its mean would be 60 % of
    # what the closed loop finished; requests of very different lengths queue long before that
    data = load_scenario("long-context-rollout").model_dump(mode="json")
    data["mix"]["burst"] = None
    mix = Scenario.model_validate(data).mix
    probes = [Probe("tiny-small", True, 0.2, 3.0 + i * 0.5) for i in range(30)]  # 30 in 17 s
    probes += [Probe("tiny-large", True, 0.5, 3.5 + i) for i in range(10)]  # 10 in 17 s: it decides
    cal = derive(probes, mix, probe_s=20.0, warm_s=3.0)
    assert cal.sustained_rps == pytest.approx((10 / 17) / 0.25)
    assert cal.planned_rps == pytest.approx(0.3 * cal.sustained_rps) == pytest.approx(cal.peak_rps)
    assert cal.rate_scale == pytest.approx(0.3 * cal.sustained_rps / 2.0)
    assert "playing at 0.71 req/s (30% of it); x0.35 the scenario's rate;" in cal.line()  # no bursts to speak of


def test_a_cache_that_holds_one_long_request_gets_room_for_the_wait_behind_it() -> None:
    # tiny-small's replicas hold 2,560 tokens: one long-context request (median 1,300 + 320) and not
    # two, so a request behind one waits for it to finish; tiny-large's 32,768 hold many. Timed alone
    # before the loops, a small long request took 2.4 s, a large one 5 s: tiny-small's target is at
    # least 3 x 2.4 s (the 7.5 s bound); tiny-large's is its fully busy p99's alone
    mix = rollout_mix()
    busy = [Probe("tiny-small", True, 0.9, 4.0 + i * 0.5, i == 3, 3.0) for i in range(20)]
    busy += [Probe("tiny-small", True, 0.3, -0.1, True, 2.4, alone=True)]  # before the loops: not a finished one
    busy += [Probe("tiny-large", True, 0.8, 4.0 + i) for i in range(5)]
    busy += [Probe("tiny-large", True, 0.6, -0.1, True, 5.0, alone=True)]
    kv = {"tiny-small": 2560, "tiny-large": 32768}
    cal = derive(busy, mix, bounds=TEMPLATE_TTFT_BOUNDS, kv_tokens=kv)
    assert cal.pool_rps == pytest.approx({"tiny-small": 20 / 17, "tiny-large": 5 / 17})
    assert cal.queue_wait_s == {"tiny-small": 2.4}
    assert cal.slo_ttft_s == {"tiny-small": 7.5, "tiny-large": 2.5}  # 7.2 s and 1.5 x 0.8 s, at bounds
    assert "at least 3x a long-context request alone on a cache that holds one (tiny-small 2.4s)" in cal.line()
    # the played requests, fast as they are, do not take the target under that wait
    played = [Probe("tiny-small", True, 0.2 + 0.01 * i, 1.0 + i) for i in range(30)]
    played += [Probe("tiny-large", True, 0.3, 1.0 + i) for i in range(10)]
    again = with_played_slos(cal, played, seconds=30, bounds=TEMPLATE_TTFT_BOUNDS)
    assert again.slo_ttft_s == {"tiny-small": 7.5, "tiny-large": 1.0}
    assert (
        "at least 3x a long-context request alone on a cache that holds one (tiny-small 2.4s), elsewhere that p99"
        in (again.slo_basis)
    )
    # on that cache the fully busy probe queues behind its long requests as the steady phase does not (a slow
    # day: its p99 13 s, the play's 0.5 s): the target follows the wait behind one (3 x 2.4 s), not 13 s
    slow = [Probe("tiny-small", True, 13.0, 4.0 + i * 0.5) for i in range(20)] + busy[20:]
    cal = derive(slow, mix, bounds=TEMPLATE_TTFT_BOUNDS, kv_tokens=kv)
    assert with_played_slos(cal, played, seconds=30, bounds=TEMPLATE_TTFT_BOUNDS).slo_ttft_s["tiny-small"] == 7.5
    # an engine that does not say its cache's size is taken to hold one long request: the wait counts
    assert derive(busy, mix, bounds=TEMPLATE_TTFT_BOUNDS).queue_wait_s == {"tiny-small": 2.4, "tiny-large": 5.0}
    # and a mix without long-context requests has no such wait
    data = load_scenario("long-context-rollout").model_dump(mode="json")
    data["mix"]["long_context_share"] = 0.0
    assert derive(busy, Scenario.model_validate(data).mix).queue_wait_s == {}
    assert cache_limited(Scenario.model_validate(data).mix, {}) == []
    # the shipped fleet: small replicas of 17 blocks x 128 tokens (2,176) hold one, the large one's 256 many
    assert cache_limited(mix, {"tiny-small": 17 * 128, "tiny-large": 256 * 128}) == ["tiny-small"]
    assert cache_limited(mix, {"tiny-small": 2 * 1620, "tiny-large": 2 * 1620 - 1}) == ["tiny-large"]


def test_engines_too_slow_for_a_judged_p99_get_the_rate_it_needs_within_a_ceiling() -> None:
    # the shipped fleet on a slow day: the large pool finished 5 requests in 17 s (0.29/s, a quarter of
    # the mix: 1.2 req/s sustained), so the bursts at 60 % put the mean at 0.34 req/s and tiny-small's
    # 5-minute window would hold 0.75 x 0.34 x 300 = 76 requests, too few for its p99. Asked for
    # 0.42 req/s on each pool the rollout saturates, the rate is raised to 0.42 / 0.75 = 0.56 req/s
    mix = rollout_mix()
    probes = [Probe("tiny-small", True, 0.5, 3.0 + i * 0.4) for i in range(40)]
    probes += [Probe("tiny-large", True, 2.0, 3.5 + i * 3) for i in range(5)]
    kv = {"tiny-small": 17 * 128, "tiny-large": 256 * 128}
    plain = derive(probes, mix, kv_tokens=kv)
    assert plain.planned_rps == pytest.approx(0.6 * (5 / 17) / 0.25 * 2.4 / 5) and not plain.floor_pool
    floor = 1.25 * 100 / 300
    cal = derive(probes, mix, kv_tokens=kv, pool_floor_rps=floor)
    assert cal.planned_rps == pytest.approx(floor / 0.75)
    assert cal.peak_rps == pytest.approx(floor / 0.75 * 5 / 2.4)
    assert (cal.floor_pool, cal.floor_short) == ("tiny-small", False)
    assert (
        "playing at 0.56 req/s (47% of it, raised so that tiny-small's SLO window holds the requests a p99 needs)"
        in (cal.line())
    )
    # on engines slower still, the mean stops at 60 % of what they sustain, and the line says what follows
    slower = [Probe("tiny-large", True, 2.0, 3.5 + i * 5) for i in range(3)] + probes[:40]
    short = derive(slower, mix, kv_tokens=kv, pool_floor_rps=floor)
    assert short.planned_rps == pytest.approx(0.6 * short.sustained_rps) and short.floor_short
    assert "the most these engines allow: tiny-small's p99 may stay too few to judge" in short.line()
    # a fleet whose caches hold many long requests has no pool the rollout saturates: no floor
    assert not derive(
        probes, mix, kv_tokens={"tiny-small": 10**6, "tiny-large": 10**6}, pool_floor_rps=floor
    ).floor_pool


def test_the_slo_targets_come_from_the_steady_mix_played_at_the_calibrated_rate() -> None:
    mix = rollout_mix()
    busy = [Probe("tiny-small", True, 0.9, 4.0 + i * 0.5) for i in range(20)]  # fully busy: 0.9 s
    busy += [Probe("tiny-large", True, 0.8, 4.0 + i) for i in range(5)]
    cal = derive(busy, mix)
    assert cal.slo_ttft_s == {"tiny-small": 1.5, "tiny-large": 1.5}  # 1.5 x 0.9 s and 0.8 s, rounded up
    # played at the calibrated rate: small requests start in 0.3-1.2 s; the large pool timed only 2
    played = [Probe("tiny-small", True, 0.3 + 0.05 * i, 1.0 + i) for i in range(19)]
    played += [Probe("tiny-large", True, 0.4, 2.0), Probe("tiny-large", True, 0.5, 9.0)]
    again = with_played_slos(cal, played, seconds=30)
    # tiny-small: 2 x 1.2 s, but at most twice the fully busy 0.9 s: 1.8 s, rounded up; tiny-large kept
    assert again.slo_ttft_s == {"tiny-small": 2.0, "tiny-large": 1.5}
    assert again.line().endswith(
        "SLO p99 TTFT <= tiny-large 1.5s, tiny-small 2s (2x the p99 of 30s played at that rate (at most 3x its p90), "
        "at most 2x the p99 with the engines fully busy, at least that p99; tiny-large: 1.5x the p99 with the engines "
        "fully busy)"
    )
    assert again.rate_scale == cal.rate_scale


def test_targets_sit_on_the_engines_ttft_bucket_bounds() -> None:
    # the rules interpolate the p99 inside a histogram bucket: with every request at 1.2 s, the
    # (1, 2.5] bucket reads a p99 of 1 + 0.99 x 1.5 = 2.485 s, over a target of 2 x 1.2 = 2.4 s.
    # At the bound (2.5 s), it is crossed only when more than 1 % of the requests took longer.
    assert TEMPLATE_TTFT_BOUNDS[:3] == (0.001, 0.005, 0.01) and 2.5 in TEMPLATE_TTFT_BOUNDS
    assert target_at_bound(2.4, TEMPLATE_TTFT_BOUNDS) == 2.5
    assert target_at_bound(2.6, TEMPLATE_TTFT_BOUNDS) == 5.0
    assert target_at_bound(5.0, TEMPLATE_TTFT_BOUNDS) == 5.0
    assert target_at_bound(3000.2, TEMPLATE_TTFT_BOUNDS) == 3000.5  # above the last bound: half seconds
    assert target_at_bound(2.4, ()) == 2.5 and target_at_bound(2.6, ()) == 3.0
    mix = rollout_mix()
    busy = [Probe("tiny-small", True, 6.0, 4.0 + i * 0.5) for i in range(20)]
    busy += [Probe("tiny-large", True, 0.8, 4.0 + i) for i in range(5)]
    cal = derive(busy, mix, bounds=TEMPLATE_TTFT_BOUNDS)
    assert cal.slo_ttft_s == {"tiny-small": 10.0, "tiny-large": 2.5}  # 9 s and 1.2 s, raised to bounds
    played = [Probe("tiny-small", True, 0.3 + 0.05 * i, 1.0 + i) for i in range(19)]  # p99 1.2 s
    played += [Probe("tiny-large", True, 0.4 + 0.01 * i, 1.0 + i) for i in range(6)]  # p99 0.45 s
    again = with_played_slos(cal, played, seconds=30, bounds=TEMPLATE_TTFT_BOUNDS)
    # tiny-small: 2 x 1.2 s played, but never under the 6 s the engines took fully busy: the 7.5 s bound
    # (a steady phase meets such moments: two long prompts on one small replica, the requests behind
    # them waiting). tiny-large: 0.9 s played, 0.8 s fully busy: at least 1 s
    assert again.slo_ttft_s == {"tiny-small": 7.5, "tiny-large": 1.0}
    assert again.line().endswith(
        "(2x the p99 of 30s played at that rate (at most 3x its p90), at most 2x the p99 with the engines fully busy, "
        "at least that p99, up to a TTFT bucket bound)"
    )


def test_one_slow_request_among_a_few_dozen_does_not_set_the_target() -> None:
    # 30 s played: 33 small requests started in 0.2-0.52 s, and one long prompt queued behind a
    # burst for 20 s. The p99 of 34 (by nearest rank: the slowest) is that one request; the target
    # is set from at most 3x the p90 (0.5 s): 2 x 1.5 s, raised to the 5 s bucket bound, not to 40 s.
    mix = rollout_mix()
    cal = derive([Probe(m, True, 3.0, 4.0 + i) for m in ("tiny-small", "tiny-large") for i in range(5)], mix)
    played = [Probe("tiny-small", True, 0.2 + 0.01 * i, 1.0 + i) for i in range(33)]
    played += [Probe("tiny-small", True, 20.0, 25.0)]
    played += [Probe("tiny-large", True, 0.6 + 0.1 * i, 1.0 + i) for i in range(8)]  # p90 1.2 s, p99 1.3 s
    again = with_played_slos(cal, played, seconds=30, bounds=TEMPLATE_TTFT_BOUNDS)
    assert again.played_ttft["tiny-small"].p99_s == 20.0
    assert again.played_ttft["tiny-small"].p90_s == pytest.approx(0.5)
    # (both within the fully busy 3 s and twice it); tiny-large's tail is within 3x its p90: 2 x its
    # p99, 2.6 s, at least the fully busy 3 s, raised to 5 s
    assert again.slo_ttft_s == {"tiny-small": 5.0, "tiny-large": 5.0}
    assert str(again.played_ttft["tiny-large"]) == "8 requests, p90 1.2s, p99 1.3s"


def test_too_few_finished_requests_is_said_not_guessed() -> None:
    probes = [Probe("tiny-small", True, 0.2, 4.0 + i) for i in range(12)]
    probes += [Probe("tiny-large", True, 0.5, 4.0), Probe("tiny-large", False, None, 6.0)]
    with pytest.raises(CalibrationError, match=r"tiny-large engines finished 1 probe request\(s\) in 17s \(1 failed\)"):
        derive(probes, rollout_mix())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_probe_over_http_finds_the_slower_pool() -> None:
    data = load_scenario("steady").model_dump()
    data["mix"]["models"] = {"fast": 0.5, "slow": 0.5}
    data["mix"]["tenants"] = [dict(t, models=None) for t in data["mix"]["tenants"]]
    mix = Scenario.model_validate(data).mix

    async def go() -> list[Probe]:
        # the slow model's engine runs at a quarter of the fast one's speed; both hold few sequences at once
        replicas = [
            SimReplica("fast-0", "fast", free_port(), EngineConfig(max_model_len=4096, max_num_seqs=2)),
            SimReplica("slow-0", "slow", free_port(), EngineConfig(max_model_len=4096, max_num_seqs=2, speed=0.25)),
        ]
        fleet = SimFleet(replicas)
        await fleet.start()
        try:
            pools = {r.model: [f"http://127.0.0.1:{r.port}"] for r in replicas}
            busy = await probe(pools, mix, probe_s=4.0, per_replica=3, alone=["slow", "fast"])
            played = await play(pools, mix, rate_scale=1.0, seconds=4.0)
            # the engine's own TTFT buckets, read from its /metrics; a dead URL first is skipped
            bounds = await asyncio.to_thread(ttft_bounds, [f"http://127.0.0.1:{free_port()}", pools["fast"][0]])
            # the cache's size as the engine reports it (vllm:cache_config_info), the pool's smallest
            kv = await asyncio.to_thread(pool_kv_tokens, pools)
            engine = EngineConfig(max_model_len=4096)
            assert kv == {"fast": engine.num_blocks * engine.block_size, "slow": engine.num_blocks * engine.block_size}
            assert bounds == TEMPLATE_TTFT_BOUNDS
            assert await asyncio.to_thread(ttft_bounds, [f"http://127.0.0.1:{free_port()}"]) is None
            return busy, played
        finally:
            await fleet.stop()

    probes, played = asyncio.run(go())
    assert all(p.ok for p in probes), [p for p in probes if not p.ok][:3]
    # before the loops, one long-context request per pool asked for, timed alone; then the mix's own requests
    alone = [p for p in probes if p.alone]
    assert sorted(p.model for p in alone) == ["fast", "slow"] and all(p.long_context and p.e2e_s for p in alone)
    assert all(p.finished_s < 0 for p in alone) and all(p.finished_s >= 0 for p in probes if not p.alone)
    cal = derive(probes, mix, probe_s=4.0, warm_s=0.5)
    assert cal.pool_rps["fast"] > 2 * cal.pool_rps["slow"]
    assert cal.sustained_rps == pytest.approx(cal.pool_rps["slow"] / 0.5)
    assert cal.slo_ttft_s["slow"] >= cal.slo_ttft_s["fast"]
    # the steady mix played open loop reaches both pools, every request timed from its stream
    assert {p.model for p in played} == {"fast", "slow"} and all(p.ok and p.ttft_s is not None for p in played)
    assert with_played_slos(cal, played, seconds=4).slo_basis.startswith("2x the p99 of 4s played")


def test_a_played_sample_that_met_a_queue_is_held_to_twice_the_fully_busy_p99() -> None:
    # a logged run: the probe's fully busy p99 3.2 s (tiny-small); the play began with two long
    # prompts on one small replica, its p90 9.5 s and p99 13 s: 2 x 13 s would make a 40 s target the
    # incident crosses late or never. Held to twice the fully busy p99, 6.4 s: the 7.5 s bound
    mix = rollout_mix()
    busy = [Probe("tiny-small", True, 3.2, 4.0 + i) for i in range(20)]
    busy += [Probe("tiny-large", True, 1.1, 4.0 + i) for i in range(5)]
    cal = derive(busy, mix, bounds=TEMPLATE_TTFT_BOUNDS)
    played = [Probe("tiny-small", True, 0.5, 1.0 + i) for i in range(29)]
    played += [Probe("tiny-small", True, 9.5 + 0.5 * i, 1.0 + i) for i in range(8)]  # p90 11 s, p99 13 s
    played += [Probe("tiny-large", True, 0.2 * i, 1.0 + i) for i in range(11)]  # p90 1.8 s, p99 2 s
    again = with_played_slos(cal, played, seconds=30, bounds=TEMPLATE_TTFT_BOUNDS)
    assert (again.played_ttft["tiny-small"].p90_s, again.played_ttft["tiny-small"].p99_s) == (11.0, 13.0)
    assert again.slo_ttft_s == {"tiny-small": 7.5, "tiny-large": 2.5}  # tiny-large: 4 s held to 2.2 s


def test_the_play_holds_one_of_the_steady_phases_bursts() -> None:
    mix = rollout_mix()  # its first burst a minute in: a 30 s play from its start would hold none
    played = played_mix(mix, 30.0)
    assert played.burst is not None and mix.burst is not None
    assert played.burst.offset_s == 10.0 and played.burst.offset_s + played.burst.length_s < 30.0
    assert (played.burst.factor, played.burst.length_s) == (mix.burst.factor, mix.burst.length_s)
    assert played.stream_share == 1.0 and played.rate == mix.rate


def calibration(planned_rps: float, wait_s: float) -> Calibration:
    return Calibration(
        sustained_rps=10.0,
        pool_rps={"tiny-small": 8.0, "tiny-large": 4.0},
        loaded_p99_s={"tiny-small": 2.0, "tiny-large": 1.0},
        planned_rps=planned_rps,
        peak_rps=planned_rps * 2,
        scenario_rps=2.4,
        utilisation=0.6,
        margin=1.5,
        queue_wait_s={"tiny-small": wait_s},
    )


def test_a_rollout_too_weak_for_the_calibrated_rate_gets_more_long_requests() -> None:
    scenario = load_scenario("long-context-rollout")  # rollout to 35 %, rollback to 5 %
    replicas = {"tiny-small": 2, "tiny-large": 1}
    # a fast day: 3.2 req/s, 3/4 of them to two small replicas, a long request 0.5 s alone: the rollout's long
    # requests keep each one 3.2 x 0.75 x 0.35 x 0.5 / 2 = 21 % busy; 30 % wants a share of 0.35 x 30/21 = 50 %
    strong, line = strengthen_rollout(scenario, calibration(3.2, 0.5), replicas)
    rollout, rollback = strong.phases
    assert rollout.set["long_context_share"] == pytest.approx(0.5, abs=1e-3)
    assert rollback.set == {"long_context_share": 0.05} and strong.mix == scenario.mix
    assert "rollout: long-context share 35% -> 50%" in line and "tiny-small replica 30% busy" in line
    # a slow day: 1.6 req/s, 2.4 s alone: 50 % busy already, the scenario as shipped
    same, nothing = strengthen_rollout(scenario, calibration(1.6, 2.4), replicas)
    assert same.phases == scenario.phases and nothing == ""
    # engines so fast that even 80 % falls short: as far as it goes, and the line says so
    capped, said = strengthen_rollout(scenario, calibration(3.2, 0.1), replicas)
    assert capped.phases[0].set["long_context_share"] == 0.8 and "the most this allows" in said
    # a rollout already past that is left as written, not lowered to it
    data = scenario.model_dump(mode="json")
    data["phases"][0]["set"]["long_context_share"] = 0.9
    heavy = Scenario.model_validate(data)
    kept, none = strengthen_rollout(heavy, calibration(3.2, 0.1), replicas)
    assert kept.phases[0].set["long_context_share"] == 0.9 and none == ""
