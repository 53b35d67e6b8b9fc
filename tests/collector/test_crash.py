"""`fleetscope collect` killed with SIGKILL mid-run and restarted: no duplicate rows, and what was
spooled before the kill is written after the restart (real processes, real chDB store)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tests.collector.helpers import Targets
from tests.collector.test_service import free_port


def serve_targets() -> tuple[int, threading.Event]:
    ready, stop = threading.Event(), threading.Event()
    port_box: list[int] = []

    def run() -> None:
        async def main() -> None:
            async with Targets() as t:
                port_box.append(t.port)
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(5)
    return port_box[0], stop


def query(store: Path, sql: str) -> list:
    code = textwrap.dedent(f"""
        import json, clickhouse_connect
        c = clickhouse_connect.get_client(dsn="chdb://{store}")
        print(json.dumps(c.query({sql!r}).result_rows))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sigkill_mid_run_then_restart_leaves_no_duplicates(tmp_path: Path) -> None:
    port, stop = serve_targets()
    store = tmp_path / "ch"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(
        {
            "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{store}",
            "FLEETSCOPE_DATA_DIR": str(tmp_path / "data"),
            "FLEETSCOPE_METADATA_URL": f"sqlite:///{tmp_path / 'meta.db'}",
            "FLEETSCOPE_COLLECTOR_FLEET_TARGETS": "false",
            "FLEETSCOPE_COLLECTOR_OTLP_HTTP_PORT": str(free_port()),
            "FLEETSCOPE_COLLECTOR_OTLP_GRPC_PORT": "0",
            "FLEETSCOPE_COLLECTOR_FLUSH_INTERVAL_S": "0.2",
            "FLEETSCOPE_COLLECTOR_STATIC_TARGETS": json.dumps(
                [
                    {
                        "job": "t",
                        "targets": [f"http://127.0.0.1:{port}/good/metrics"],
                        "labels": {"replica": "good"},
                        "interval_s": 0.25,
                        "timeout_s": 0.2,
                    }
                ]
            ),
        }
    )
    exe = str(Path(sys.executable).parent / "fleetscope")
    try:
        first = subprocess.Popen(
            [exe, "collect"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        time.sleep(6)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = subprocess.Popen(
            [exe, "collect"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        time.sleep(5)
        second.send_signal(signal.SIGTERM)
        output, _ = second.communicate(timeout=30)
        assert second.returncode == 0, output
        assert "everything written" in output
    finally:
        stop.set()
    total, unique = query(store, "SELECT count(), uniqExact(fingerprint, ts) FROM samples")[0]
    assert total == unique and total > 0
    scrapes, scrape_times = query(store, "SELECT count(), uniqExact(ts) FROM scrapes")[0]
    assert scrapes == scrape_times
    assert scrapes * 432 == total  # every stored scrape has all its samples: none half-written
    assert list((tmp_path / "data" / "spool").glob("*.batch")) == []
