"""``fleetscope up`` run as a user runs it, for the end-to-end tests: a subprocess in its own
process group, its output read as it comes, waited on by pattern, stopped with Ctrl-C (SIGINT)."""

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

EXE = Path(sys.executable).parent / "fleetscope"


def clean_env() -> dict[str, str]:
    """This environment without FLEETSCOPE_* variables: the test's config file says everything."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}


def fleet_pids(data_dir: Path) -> list[int]:
    """The process groups of the fleet ``up`` started (engines, gateway), from the launcher's state."""
    state = json.loads((data_dir / "fleet" / "state.json").read_text())
    return [int(r["pid"]) for r in (state.get("replicas") or state).values() if isinstance(r, dict) and "pid" in r]


def write_config(tmp: Path, otlp_port: int, scrape_s: float) -> Path:
    """``tmp/fleetscope.yaml``: stores under ``tmp``, the spec ``tmp/fleet.yaml``, the collector on
    ``otlp_port`` scraping every ``scrape_s``, and only the rules of ``tmp/rules.yaml``."""
    import yaml

    config = {
        "data_dir": str(tmp / "data"),
        "clickhouse": {"url": f"chdb:{tmp / 'ch'}"},
        "metadata": {"url": f"sqlite:///{tmp / 'meta.db'}"},
        "fleet": {"spec": str(tmp / "fleet.yaml")},
        "collector": {
            "otlp_http_port": otlp_port,
            "otlp_grpc_port": 0,
            "scrape_interval_s": scrape_s,
            "scrape_timeout_s": scrape_s,
        },
        "alerts": {"builtin_rules": False, "rule_files": [str(tmp / "rules.yaml")]},
    }
    (tmp / "fleetscope.yaml").write_text(yaml.safe_dump(config))
    return tmp / "fleetscope.yaml"


def cli(config: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``fleetscope ARGS --config CONFIG`` run in ``cwd`` as a user runs it, its output captured."""
    return subprocess.run(
        [str(EXE), *args, "--config", str(config)],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def sql_rows(config: Path, cwd: Path, query: str) -> list[dict]:
    """``fleetscope sql QUERY --format json``'s rows; the command must succeed."""
    done = cli(config, cwd, "sql", query, "--format", "json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["rows"])


class Up:
    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [str(EXE), "up", *args],
            cwd=cwd,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self._lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def until(self, pattern: str, timeout_s: float) -> str:
        """The first output line matching ``pattern``, waiting up to ``timeout_s``; else the output so far."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.seen:
                if re.search(pattern, line):
                    return line
            try:
                self.seen.append(self._lines.get(timeout=0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s:g}s; output:\n" + "".join(self.seen))

    def stop(self, timeout_s: float) -> str:
        """Ctrl-C, then wait (killing the group after ``timeout_s``); the whole output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        time.sleep(0.5)
        rest = iter(lambda: self._lines.get_nowait() if not self._lines.empty() else "", "")
        return "".join(self.seen) + "".join(rest)
