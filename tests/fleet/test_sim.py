"""The engine simulator: vLLM's exposition, the behaviour of a saturating KV cache, and the same
HTTP API the gateway and the traffic generator use."""

from __future__ import annotations

import asyncio
import random
import socket
import statistics
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleet.loadgen import Targets, run_scenario
from fleet.sim.engine import EngineConfig, SimEngine, SimRequest
from fleet.sim.metrics import Exposition
from fleet.sim.server import SimFleet, SimReplica
from fleet.traffic import Scenario, load_scenario

REAL = (Path(__file__).resolve().parents[1] / "collector" / "data" / "vllm-0.32-cpu-metrics.txt").read_text()


def shape(text: str) -> dict[str, tuple]:
    """family -> (type, sorted sample names, label names, histogram bounds)."""
    out = {}
    for family in text_string_to_metric_families(text):
        bounds = tuple(s.labels["le"] for s in family.samples if s.name.endswith("_bucket"))
        labels = tuple(sorted({k for s in family.samples for k in s.labels if k != "le"}))
        out[family.name] = (family.type, tuple(sorted({s.name for s in family.samples})), labels, bounds)
    return out


def test_exposition_has_the_real_engines_families_labels_types_and_buckets() -> None:
    engine = SimEngine(EngineConfig())
    sim = Exposition(engine, "tiny-small").render()
    assert shape(sim) == shape(REAL)
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-small"}' in sim


def run_workload(long_share: float, seed: int = 1, n: int = 600) -> dict[str, float]:
    """Poisson arrivals in virtual time against a fixed block budget."""
    rng = random.Random(seed)
    engine = SimEngine(EngineConfig(num_blocks=400, block_size=16, max_model_len=2048))
    arrivals, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(8.0)
        length = rng.randint(1100, 1500) if rng.random() < long_share else rng.randint(50, 400)
        arrivals.append(SimRequest(str(i), [rng.randint(3, 999) for _ in range(length)], rng.randint(32, 256), t))
    now, kv = 0.0, []
    while arrivals or engine.has_work():
        while arrivals and arrivals[0].arrival <= now:
            engine.submit(arrivals.pop(0))
        if not engine.has_work():
            now = arrivals[0].arrival
            continue
        duration, _produced, _finished = engine.step(now)
        now += duration
        kv.append(engine.kv_usage)
    ttft = sorted(engine.stats.observations["ttft"])
    return {
        "kv": statistics.mean(kv),
        "preemptions": engine.stats.preemptions,
        "queue": statistics.mean(engine.stats.observations["queue"]),
        "p99_ttft": ttft[int(0.99 * len(ttft))],
        "finished": engine.stats.finished["length"],
    }


def test_more_long_context_raises_kv_usage_preemptions_queue_time_and_p99_ttft() -> None:
    low, high = run_workload(0.05), run_workload(0.35)
    assert low["finished"] == high["finished"] == 600
    assert high["kv"] > low["kv"] + 0.2
    assert high["preemptions"] > low["preemptions"]
    assert high["queue"] > 5 * low["queue"]
    assert high["p99_ttft"] > 3 * low["p99_ttft"]


def test_prefix_caching_reuses_shared_system_prompts() -> None:
    engine = SimEngine(EngineConfig(num_blocks=200, block_size=16, max_model_len=2048))
    system = list(range(3, 3 + 256))
    for i in range(10):
        engine.submit(SimRequest(str(i), system + [500 + i] * 40, 8, 0.0))
        now = 0.0
        while engine.has_work():
            now += engine.step(now)[0]
    assert engine.stats.prefix_hits >= 9 * 256  # every request after the first reuses the 16 blocks
    assert engine.stats.cached_prompt_tokens >= 9 * 256


def counters(text: str) -> dict[str, float]:
    wanted = {"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"}
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_api_counters_monotonic_and_reset_on_restart() -> None:
    async def go() -> tuple[list[dict], dict, list[str]]:
        replica = SimReplica("sim-0", "tiny-small", free_port(), EngineConfig(num_blocks=256, max_model_len=2048))
        fleet = SimFleet([replica])
        await fleet.start()
        base = f"http://127.0.0.1:{replica.port}"
        seen = []
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{base}/health")).status_code == 200
            models = (await client.get(f"{base}/v1/models")).json()
            for _ in range(4):
                r = await client.post(
                    f"{base}/v1/completions",
                    json={"model": "tiny-small", "prompt": list(range(3, 103)), "max_tokens": 20},
                )
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
                seen.append(counters((await client.get(f"{base}/metrics")).text))
            events = []
            async with client.stream(
                "POST",
                f"{base}/v1/chat/completions",
                json={
                    "model": "tiny-small",
                    "messages": [{"role": "user", "content": "hi" * 50}],
                    "max_tokens": 12,
                    "stream": True,
                },
            ) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
            await client.post(f"{base}/sim/restart")
            seen.append(counters((await client.get(f"{base}/metrics")).text))
        await fleet.stop()
        return seen, models, events

    seen, models, events = asyncio.run(go())
    prompt = [c["vllm:prompt_tokens_total"] for c in seen[:4]]
    assert prompt == sorted(prompt) and prompt[-1] == 400  # monotonic
    assert seen[-1]["vllm:prompt_tokens_total"] == 0 and seen[-1]["vllm:generation_tokens_total"] == 0  # restart
    assert models["data"][0]["max_model_len"] == 2048
    assert events[-1] == "[DONE]" and len(events) == 12 + 2  # a chunk per token, the final chunk, [DONE]


def test_traffic_generator_works_unchanged_against_simulated_replicas() -> None:
    data = load_scenario("steady").model_dump()
    data["mix"]["models"] = {"tiny-small": 1.0}
    scenario = Scenario.model_validate(data)

    async def go():
        replicas = [
            SimReplica(f"sim-{i}", "tiny-small", free_port(), EngineConfig(max_model_len=2048)) for i in range(3)
        ]
        fleet = SimFleet(replicas)
        await fleet.start()
        try:
            return await run_scenario(
                scenario,
                Targets(by_model={"tiny-small": [f"http://127.0.0.1:{r.port}" for r in replicas]}),
                duration_s=4,
                rate_scale=5,
                seed=4,
            )
        finally:
            await fleet.stop()

    stats = asyncio.run(go())
    assert stats.sent >= 20 and stats.ok == stats.sent, stats.summary()
    assert stats.summary()["ttft_p50_s"] is not None


def test_simulated_engines_send_llm_request_spans_with_the_trace_id() -> None:
    from aiohttp import web

    from collector.otlp import decode_protobuf, request_row

    rows: list[dict] = []

    async def receive(request: web.Request) -> web.Response:
        rows.extend(r for r in (request_row(s) for s in decode_protobuf(await request.read())) if r)
        return web.Response()

    async def go() -> None:
        otlp_port = free_port()
        app = web.Application()
        app.router.add_post("/v1/traces", receive)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", otlp_port).start()
        replica = SimReplica("sim-7", "tiny-small", free_port(), EngineConfig(max_model_len=2048), gpu_type="H100")
        fleet = SimFleet([replica], otlp_endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces")
        await fleet.start()
        async with httpx.AsyncClient() as client:
            r = await client.post(
                f"http://127.0.0.1:{replica.port}/v1/completions",
                json={"prompt": list(range(3, 300)), "max_tokens": 9},
                headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            )
            assert r.status_code == 200
        await asyncio.sleep(1.5)
        await fleet.stop()
        await runner.cleanup()

    asyncio.run(go())
    (row,) = rows
    assert row["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert (row["replica"], row["model"], row["prompt_tokens"], row["completion_tokens"]) == (
        "sim-7",
        "tiny-small",
        297,
        9,
    )
    assert 0 < row["ttft_seconds"] <= row["e2e_seconds"]


def test_fleet_launcher_runs_sim_replicas_in_one_process_and_stops_them(tmp_path: Path) -> None:
    from fleet.launcher import Launcher
    from fleet.processes import group_members
    from fleet.spec import load_spec

    ports = [free_port() for _ in range(3)]
    (tmp_path / "fleet.yaml").write_text(f"""
otlp_traces_endpoint: null
models:
  m: {{path: {tmp_path / "no-model-needed"}}}
replicas:
  - {{name: s0, model: m, port: {ports[0]}, engine: sim, engine_args: {{num_gpu_blocks_override: 65, max_model_len: 1024}}}}
  - {{name: s1, model: m, port: {ports[1]}, engine: sim}}
  - {{name: s2, model: m, port: {ports[2]}, engine: sim}}
""")
    spec = load_spec(tmp_path / "fleet.yaml", base_dir=tmp_path)
    launcher = Launcher(spec, tmp_path / "state", spec_path=tmp_path / "fleet.yaml")
    records = launcher.start()
    try:
        assert len({r.pid for r in records}) == 1  # one process hosts all three
        assert [s.health for s in launcher.status()] == ["healthy"] * 3
        models = httpx.get(f"http://127.0.0.1:{ports[0]}/v1/models").json()
        assert models["data"][0]["max_model_len"] == 1024
    finally:
        launcher.stop()
    assert group_members(records[0].pid) == []


def test_stopping_the_fleet_answers_the_requests_in_flight_and_leaves_nothing_pending() -> None:
    """A stop in the middle of requests (a test's teardown, Ctrl-C on ``fleetscope up``) answers
    them with an error, as vLLM aborts them, instead of leaving their handlers waiting on a loop
    about to close: such handlers were destroyed later by the garbage collector, in whatever the
    process ran next (CI saw their tracebacks logged inside a Streamlit script's compile)."""

    async def go() -> tuple[int, dict, list[asyncio.Task]]:
        replica = SimReplica("sim-stop", "tiny-small", free_port(), EngineConfig(max_model_len=2048))
        fleet = SimFleet([replica])
        await fleet.start()
        url = f"http://127.0.0.1:{replica.port}/v1/completions"
        body = {"prompt": list(range(3, 300)), "max_tokens": 1500}
        async with httpx.AsyncClient(timeout=30) as client:
            answered = asyncio.create_task(client.post(url, json=body))
            dropped = asyncio.create_task(client.post(url, json=body))
            while len(replica.waiters) < 2:
                await asyncio.sleep(0.01)
            dropped.cancel()  # this client gives up; its handler still waits on the engine
            await asyncio.gather(dropped, return_exceptions=True)
            await fleet.stop()
            response = await answered
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        return response.status_code, response.json(), left

    status, answer, left = asyncio.run(go())
    assert (status, answer["error"]["message"]) == (500, "engine stopped")
    assert left == []
