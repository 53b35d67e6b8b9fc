"""``fleetscope up --fleet sim``: one process collects from a simulated fleet (its gateway and the
traffic generator as children), evaluates a rule whose alert reaches the built-in webhook sink,
serves the dashboard, prints status lines; Ctrl-C stops everything with no process left behind,
and the store then reads the data (scrapes from every replica, the gateway's request log)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from fleet.launcher import group_members
from tests.integration.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp: Path) -> Path:
    otlp, gateway = free_port(), free_port()
    spec = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    spec["otlp_traces_endpoint"] = f"http://127.0.0.1:{otlp}/v1/traces"
    spec["gateway"]["port"] = gateway
    spec["gateway"]["request_log_url"] = f"http://127.0.0.1:{otlp}/v1/requests"
    for replica in spec["replicas"]:
        replica["port"] = free_port()
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(spec))
    # a rule that fires as soon as a replica holds any KV blocks, so the alert path shows in seconds
    (tmp / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "demo", "interval": "2s", "rules": [{
        "name": "KVCacheInUse", "expr": 'kv_cache_usage_max{window="1m"}', "op": ">", "threshold": 0.0, "for": "2s",
        "labels": {"severity": "page"}, "annotations": {"summary": "KV cache of {{ $labels.replica }} in use"}}]}]}))
    config = {
        "data_dir": str(tmp / "data"),
        "clickhouse": {"url": f"chdb:{tmp / 'ch'}"},
        "metadata": {"url": f"sqlite:///{tmp / 'meta.db'}"},
        "fleet": {"spec": str(tmp / "fleet.yaml")},
        "collector": {"otlp_http_port": otlp, "otlp_grpc_port": 0, "scrape_interval_s": 1, "scrape_timeout_s": 1},
        "alerts": {"builtin_rules": False, "rule_files": [str(tmp / "rules.yaml")]},
    }
    (tmp / "fleetscope.yaml").write_text(yaml.safe_dump(config))
    return tmp / "fleetscope.yaml"



def test_up_with_a_simulated_fleet_collects_alerts_serves_and_stops_clean(tmp_path: Path) -> None:
    config = _config(tmp_path)
    port = free_port()
    exe = Path(sys.executable).parent / "fleetscope"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    proc = subprocess.Popen([str(exe), "up", "--fleet", "sim", "--scenario", "long-context-rollout", "--speed", "10",
                             "--port", str(port), "--config", str(config)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def until(pattern: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in seen:
                if re.search(pattern, line):
                    return line
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                if proc.poll() is not None:
                    break
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s:g}s; output:\n" + "".join(seen))

    children: list[int] = []
    try:
        until(r"dashboard at http://127\.0\.0\.1:\d+", 120)
        assert httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).text == "ok"
        state = json.loads((tmp_path / "data" / "fleet" / "state.json").read_text())
        children = [int(r["pid"]) for r in (state.get("replicas") or state).values() if isinstance(r, dict) and "pid" in r]
        assert len(children) >= 2  # the simulated engines' process and the gateway
        until(r"webhook ← \S+ FIRING\s+KVCacheInUse \[page\] — .*replica=", 90)  # the alert reached the sink
        status = until(r"replicas up [1-9]\d*/\d+ · [0-9.]+ req/s", 60)
        assert "firing alerts" in status
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.5)
    out = "".join(seen) + "".join(iter(lambda: lines.get_nowait() if not lines.empty() else "", ""))
    assert proc.returncode == 0, out
    assert "stopped; everything written" in out
    assert group_members(proc.pid) == []  # the up process group: the traffic generator ran in its own
    assert not [pid for pid in children if group_members(pid)], out  # no simulated engine nor gateway left

    # the store, now free, holds what was collected: `fleetscope sql` reads it
    def sql(query: str) -> list[dict]:
        done = subprocess.run([str(exe), "sql", query, "--format", "json", "--config", str(config)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["rows"]

    reporting = {r["replica"] for r in sql("SELECT DISTINCT replica FROM series WHERE metric = 'vllm:num_requests_running'")}
    assert reporting == {r["name"] for r in yaml.safe_load((tmp_path / "fleet.yaml").read_text())["replicas"]}
    logged = sql("SELECT count() AS n FROM requests WHERE source = 'gateway'")
    assert int(logged[0]["n"]) > 0
