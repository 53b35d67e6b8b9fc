"""The live autoscaler on simulated engines in real time, every part real: the launcher's processes
(a simulated replica, the gateway, the autoscaler itself), a collector in process on a chDB store.
Under load the tiny-small pool scales 1 -> 2 (the new replica modelled with a cold start), is
printed with its decision, healthy and first-token times, and scales back once the load ends; the
events land in ``scale_events`` tied by their decision, the new replica was scraped only while it
served (no failed scrape: nothing for ReplicaDown to page on), and no request failed."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from collector.events import mount
from collector.service import Collector, CollectorConfig
from collector.targets import FileDiscovery, make_target
from collector.writer import Writer, WriterConfig
from fleet.launcher import Launcher
from fleet.spec import load_spec
from fleetscope.up_scaling import Scaling
from migrations import clickhouse_runner

OUT = re.compile(
    r"tiny-small 1 -> 2: decided \d\d:\d\d:\d\d \(requests_waiting [\d.]+ > 1\), healthy \+(\d+) s, "
    r"first token \+(\d+) s \(small-1\)"
)
IN = re.compile(
    r"tiny-small 2 -> 1: decided \d\d:\d\d:\d\d \(requests_waiting [\d.]+ < 0.1\), small-1 (drained|removed)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_pair() -> int:
    for _ in range(200):
        base = random.randint(20000, 40000)
        ok = True
        for port in (base, base + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
        if ok:
            return base
    raise AssertionError("no two free ports in a row")


def write_spec(path: Path, collector_port: int) -> None:
    path.write_text(
        f"""
host: 127.0.0.1
otlp_traces_endpoint: null
health_timeout_s: 60
models:
  tiny-small: {{path: {path.parent}/no-model, slo: {{ttft: 4.0}}}}
replicas:
  - name: small-0
    model: tiny-small
    port: {free_port()}
    engine: sim
    gpu_type: cpu-demo
    engine_args: {{max_model_len: 2048, max_num_seqs: 2, sim_speed: 0.05}}
gateway:
  port: {free_port()}
  request_log_url: http://127.0.0.1:{collector_port}/v1/requests
  request_log_flush_s: 0.2
autoscale:
  interval_s: 0.5
  first_port: {free_pair()}
  events_url: http://127.0.0.1:{collector_port}/v1/events
  pools:
    tiny-small:
      min_replicas: 1
      max_replicas: 2
      out: {{requests_waiting: 1.0}}
      in: {{requests_waiting: 0.1}}
      out_for_s: 1
      in_for_s: 2
      out_cooldown_s: 1
      in_cooldown_s: 2
      cold_start_s: 1
      drain_timeout_s: 20
"""
    )


async def load(gateway: str, stop: asyncio.Event, clients: int = 6) -> list[int]:
    """Streamed requests from ``clients`` loops until ``stop``; each finishes the one it has."""
    codes: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            body = {"model": "tiny-small", "prompt": "hi " * 30, "max_tokens": 24, "stream": True}
            async with client.stream("POST", f"{gateway}/v1/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    pass
                codes.append(r.status_code)

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(one(client) for _ in range(clients)))
    return codes


async def wait_for(path: Path, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if match := pattern.search(text):
            return match
        await asyncio.sleep(0.2)
    raise AssertionError(f"{pattern.pattern!r} not in {path} after {timeout_s:g}s:\n{text}")


def test_the_live_loop_scales_out_under_load_and_back_in_after_it(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    port = free_port()
    spec_path = tmp_path / "fleet.yaml"
    write_spec(spec_path, port)
    spec = load_spec(spec_path)
    state = tmp_path / "fleet"
    launcher = Launcher(spec, state, spec_path=spec_path)
    small0 = spec.replicas[0]
    static = make_target(
        f"127.0.0.1:{small0.port}", job="vllm", labels={"replica": "small-0", "model": "tiny-small"},
        interval_s=1.0, timeout_s=1.0,
    )  # fmt: skip
    state.mkdir()
    (state / "targets.json").write_text("[]")
    config = CollectorConfig(
        http_port=port,
        static_targets=[static],
        file_sd=[FileDiscovery(state / "targets.json", "vllm", 1.0, 1.0)],
        file_sd_poll_s=0.5,
    )
    collector = Collector(
        config, Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.2)), CollectorRegistry()
    )
    mount(collector)
    log = state / "autoscaler.log"
    seen: dict[str, object] = {}

    async def go() -> bool:
        await asyncio.to_thread(launcher.start)  # healthy before it is scraped
        await collector.start()
        try:
            await asyncio.to_thread(launcher.start_autoscaler, file_sd_wait_s=2.0)
            stop = asyncio.Event()
            traffic = asyncio.create_task(load(f"http://127.0.0.1:{spec.gateway.port}", stop))  # type: ignore[union-attr]
            seen["out"] = await wait_for(log, OUT, 90)
            seen["status"] = {r.name: r.health for r in await asyncio.to_thread(launcher.status)}
            stop.set()
            seen["codes"] = await traffic
            seen["in"] = await wait_for(log, IN, 90)
            seen["status_after"] = {r.name for r in await asyncio.to_thread(launcher.status)}
        finally:
            await asyncio.to_thread(launcher.stop)
            await asyncio.sleep(1.0)  # the gateway's and the autoscaler's last lines reach the collector
        return await collector.stop()

    assert asyncio.run(go())
    healthy_s, first_s = (int(g) for g in seen["out"].groups())  # type: ignore[union-attr]
    assert healthy_s <= first_s
    assert seen["status"]["small-1"] == "healthy" and seen["status"]["autoscaler"] == "healthy"  # type: ignore[index]
    assert "small-1" not in seen["status_after"]  # type: ignore[operator]
    codes = seen["codes"]
    assert codes and set(codes) == {200}  # type: ignore[arg-type]

    events = ch.query(
        "SELECT kind, decision_id, replica, toUnixTimestamp64Milli(ts) FROM scale_events ORDER BY ts, kind"
    ).result_rows
    kinds = [e[0] for e in events]
    assert kinds.count("scale_out") == 1 and kinds.count("scale_in") == 1, kinds
    out_id = next(e[1] for e in events if e[0] == "scale_out")
    out = [e for e in events if e[1] == out_id]
    assert [e[0] for e in out] == ["scale_out", "ready", "serving"] and {e[2] for e in out} == {"small-1"}
    assert out[0][3] < out[1][3] <= out[2][3]  # decision -> ready -> serving
    in_id = next(e[1] for e in events if e[0] == "scale_in")
    assert [e[0] for e in events if e[1] == in_id] == ["scale_in", "draining", "removed"]
    assert set(kinds) <= {"scale_out", "ready", "serving", "held_at_max", "scale_in", "draining", "removed"}

    outcomes = ch.query("SELECT outcome, replica, count() FROM requests GROUP BY outcome, replica").result_rows
    assert {o for o, _, _ in outcomes} == {"ok"}, outcomes  # nothing failed by the scale-out or the drain
    assert {r for _, r, _ in outcomes} == {"small-0", "small-1"}
    scrapes = ch.query("SELECT count(), min(up) FROM scrapes WHERE replica = 'small-1'").result_rows[0]
    assert scrapes[0] >= 1 and scrapes[1] == 1  # scraped while it served, never a failed scrape

    # what `fleetscope up` prints, read back from the store: the autoscaler's own line, same numbers
    scaling = Scaling()
    scaling.since = datetime.now(UTC) - timedelta(minutes=10)
    printed = scaling.lines(ch)
    assert printed[0] == seen["out"].group(0)  # type: ignore[union-attr]
    assert IN.search(printed[1]) and "small-1 removed +" in printed[1] and scaling.lines(ch) == []
