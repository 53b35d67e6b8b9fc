"""The traffic generator is open loop: arrivals keep their schedule whatever the answers (slow,
or refused with 429), nothing caps the requests in flight unless the mix says so, and the 429s
are counted as shed with their Retry-After."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from fleet.loadgen import Targets, run_scenario
from fleet.traffic import Scenario


def _scenario(rate: float, max_in_flight: int | None) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "open-loop",
            "duration_s": 3,
            "mix": {
                "rate": rate,
                "max_in_flight": max_in_flight,
                "tenants": [{"name": "acme", "weight": 1.0}],
                "prompt_tokens": {"median": 16, "sigma": 0.1, "min": 8, "max": 32},
                "output_tokens": {"median": 4, "sigma": 0.1, "min": 2, "max": 8},
                "models": {"tiny-small": 1.0},
                "stream_share": 0.5,
            },
        }
    )


class SlowFleet:
    """Answers every other request with 429 (Retry-After: 7) at once, holds the others for 2 s."""

    def __init__(self) -> None:
        self.arrived: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.refused = 0
        self.longest_stall = 0.0  # the event loop's own longest delay (the machine's, not the schedule's)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        self.arrived.append(loop.time())
        await request.read()
        if len(self.arrived) % 2 == 0:
            self.refused += 1
            return web.json_response(
                {"error": {"message": "shed", "type": "shed_queue_time"}}, status=429, headers={"Retry-After": "7"}
            )
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(2.0)
        finally:
            self.in_flight -= 1
        return web.json_response(
            {"choices": [{"text": "ok", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
        )


async def _play(scenario: Scenario) -> tuple[SlowFleet, dict, list]:
    fleet = SlowFleet()
    app = web.Application()
    app.router.add_post("/v1/completions", fleet.completions)

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    results: list = []
    watch = asyncio.create_task(_watch_the_loop(fleet))
    try:
        stats = await run_scenario(
            scenario, Targets(gateway=f"http://127.0.0.1:{port}"), seed=3, on_result=results.append
        )
    finally:
        watch.cancel()
        await runner.cleanup()
    return fleet, stats.summary(), results


async def _watch_the_loop(fleet: SlowFleet) -> None:
    """How late the loop wakes a 10 ms sleep, at most: a busy machine (a parallel test's work)
    that holds the whole process up delays the arrivals as much, whatever their schedule."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(0.01)
        fleet.longest_stall = max(fleet.longest_stall, loop.time() - t - 0.01)


def test_arrivals_keep_their_schedule_whatever_the_answers() -> None:
    fleet, summary, results = asyncio.run(_play(_scenario(rate=40.0, max_in_flight=None)))
    # ~120 arrivals in 3 s at 40/s (Poisson: well inside 70-170), every one sent
    assert 70 <= summary["sent"] <= 170 and summary["not_sent"] == 0
    assert len(fleet.arrived) == summary["sent"]
    # while every answered request was held 2 s, arrivals went on: no gap of the schedule's
    # making (a closed loop would have stopped at its cap for up to the 2 s hold; the schedule's
    # own longest gap at 40/s is about 0.15 s), beyond what the machine held the whole process up
    # for, and far more in flight than a cap of 10
    gaps = [b - a for a, b in zip(fleet.arrived, fleet.arrived[1:], strict=False)]
    assert max(gaps) < 0.5 + fleet.longest_stall and fleet.most_in_flight > 20
    # the refusals are counted as shed, with their Retry-After
    assert summary["shed"] == fleet.refused > 20
    refused = [r for r in results if r.status == 429]
    assert len(refused) == fleet.refused and {r.retry_after_s for r in refused} == {7.0}
    assert {r.error for r in refused} == {"http 429 shed_queue_time"}  # the reason the fleet gave


def test_a_cap_on_requests_in_flight_leaves_arrivals_unsent_never_late() -> None:
    fleet, summary, _results = asyncio.run(_play(_scenario(rate=40.0, max_in_flight=10)))
    assert fleet.most_in_flight <= 10
    assert summary["not_sent"] > 20  # the arrivals past the cap: counted, not sent later
    assert summary["sent"] + summary["not_sent"] >= 70
