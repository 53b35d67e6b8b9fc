"""``fleetscope up --fleet sim``: one process collects from a simulated fleet (its gateway and the
traffic generator as children), evaluates a rule whose alert reaches the built-in webhook sink,
serves the dashboard, prints status lines; Ctrl-C stops everything with no process left behind,
and the store then reads the data (scrapes from every replica, the gateway's request log)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import yaml

from fleet.processes import group_members
from tests.integration.conftest import free_port
from tests.integration.uprun import Up, fleet_pids, sql_rows, write_config

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
    (tmp / "rules.yaml").write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "demo",
                        "interval": "2s",
                        "rules": [
                            {
                                "name": "KVCacheInUse",
                                "expr": 'kv_cache_usage_max{window="1m"}',
                                "op": ">",
                                "threshold": 0.0,
                                "for": "2s",
                                "labels": {"severity": "page"},
                                "annotations": {"summary": "KV cache of {{ $labels.replica }} in use"},
                            }
                        ],
                    }
                ]
            }
        )
    )
    return write_config(tmp, otlp, scrape_s=1)


def test_up_with_a_simulated_fleet_collects_alerts_serves_and_stops_clean(tmp_path: Path) -> None:
    config = _config(tmp_path)
    port = free_port()
    up = Up(
        [
            "--fleet",
            "sim",
            "--scenario",
            "long-context-rollout",
            "--speed",
            "10",
            "--port",
            str(port),
            "--config",
            str(config),
        ],
        tmp_path,
    )
    children: list[int] = []
    try:
        announced = up.until(r"dashboard at http://127\.0\.0\.1:\d+ \(process \d+", 120)
        dashboard_pid = int(re.search(r"process (\d+)", announced).group(1))
        assert httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).text == "ok"
        evaluator_pid = int(
            re.search(r"process (\d+)", up.until(r"alerts: 1 rule\(s\) evaluated \(process", 5)).group(1)
        )
        # the collector (this process), the evaluator and the dashboard each on an interpreter of its own
        assert len({up.proc.pid, dashboard_pid, evaluator_pid}) == 3
        up.until(r"traffic: scenario long-context-rollout", 90)
        said = "".join(up.seen)  # the steady phase does not share the cores with up's own start
        assert said.index("dashboard at") < said.index("traffic: scenario"), said
        children = fleet_pids(tmp_path / "data")
        assert len(children) >= 2  # the simulated engines' process and the gateway
        up.until(r"webhook ← \S+ FIRING\s+KVCacheInUse \[page\] — .*replica=", 90)  # the alert reached the sink
        status = up.until(r"replicas up [1-9]\d*/\d+ · [0-9.]+ req/s", 60)
        assert "firing alerts" in status
    finally:
        out = up.stop(90)
    assert up.proc.returncode == 0, out
    assert "stopped; everything written" in out
    assert group_members(up.proc.pid) == []  # the up process group: the traffic generator ran in its own
    assert not [pid for pid in children if group_members(pid)], out  # no simulated engine nor gateway left
    assert not [pid for pid in (dashboard_pid, evaluator_pid) if group_members(pid)], (
        out
    )  # nor the dashboard, the evaluator

    # the store, now free, holds what was collected: `fleetscope sql` reads it
    def sql(query: str) -> list[dict]:
        return sql_rows(config, tmp_path, query)

    reporting = {
        r["replica"] for r in sql("SELECT DISTINCT replica FROM series WHERE metric = 'vllm:num_requests_running'")
    }
    assert reporting == {r["name"] for r in yaml.safe_load((tmp_path / "fleet.yaml").read_text())["replicas"]}
    logged = sql("SELECT count() AS n FROM requests WHERE source = 'gateway'")
    assert int(logged[0]["n"]) > 0
