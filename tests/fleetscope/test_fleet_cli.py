"""`fleetscope fleet up` in the foreground, stopped with Ctrl-C as a terminal sends it: every
replica and the gateway stop, nothing is left running (simulated replicas: no vLLM needed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fleet.processes import group_members


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ctrl_c_stops_the_whole_fleet(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    spec = tmp_path / "fleet.yaml"
    spec.write_text(f"""
otlp_traces_endpoint: null
models:
  small: {{path: {tmp_path / "unused"}}}
replicas:
  - {{name: s0, model: small, port: {ports[0]}, engine: sim}}
  - {{name: s1, model: small, port: {ports[1]}, engine: sim}}
gateway: {{port: {ports[2]}, request_log_url: null}}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["FLEETSCOPE_DATA_DIR"] = str(tmp_path / "data")
    exe = str(Path(sys.executable).parent / "fleetscope")
    proc = subprocess.Popen(
        [exe, "fleet", "up", "--spec", str(spec)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ctrl-C stops the fleet" in line or not line:
            break
    status = "".join(lines)
    assert "gateway" in status and status.count("healthy") >= 3, status
    pids = {int(part) for line in lines for part in line.split()[2:3] if part.isdigit()}
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground group
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "stopping the fleet" in out and "stopped gateway" in out
    assert pids and all(group_members(pid) == [] for pid in pids)
