"""``fleetscope alerts run`` as a process: killed (SIGKILL) while the receiver is down, it
delivers the notification after a restart, exactly once, and does not page again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.alerts.receiver import ScriptedReceiver
from tests.conftest import run_cli

RULES = """\
groups:
  - name: always
    interval: 1s
    rules:
      - name: QueueTooLong
        expr: "SELECT 'small-0' AS replica, 7 AS value"
        op: ">"
        threshold: 5
        labels: {severity: page}
        annotations: {summary: "{{ $labels.replica }} has {{ $value }} requests waiting"}
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outbox(db: Path) -> list[dict]:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key, status, attempts, last_error FROM alert_outbox ORDER BY id"))
            return [dict(r._mapping) for r in rows]
    except Exception:  # noqa: BLE001 - not migrated yet
        return []
    finally:
        engine.dispose()


def start(config: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    exe = Path(sys.executable).parent / "fleetscope"
    return subprocess.Popen(
        [str(exe), "alerts", "run", "--config", str(config)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the evaluator exited ({proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}"
            )
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_while_the_receiver_is_down_it_delivers_once_after_restart(tmp_path: Path) -> None:
    port = closed_port()
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "fleetscope.yaml"
    config.write_text(
        json.dumps(
            {
                "clickhouse": {"url": f"chdb:{tmp_path / 'ch'}"},
                "metadata": {"url": f"sqlite:///{tmp_path / 'm.db'}"},
                "alerts": {
                    "builtin_rules": False,
                    "rule_files": [str(tmp_path / "rules.yaml")],
                    "receivers": [{"name": "oncall", "type": "webhook", "url": f"http://127.0.0.1:{port}/hook"}],
                    "route": {"receiver": "oncall", "group_wait": "0s"},
                    "delivery_poll_s": 0.2,
                },
            }
        )
    )
    db = tmp_path / "m.db"

    first = start(config, tmp_path)
    try:
        wait_for(lambda: any(r["attempts"] >= 1 for r in outbox(db)), 120, "a failed delivery attempt", first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    (row,) = outbox(db)
    assert row["status"] == "pending" and "refused" in (row["last_error"] or "").lower()

    receiver = ScriptedReceiver(port)  # the receiver comes back
    second = start(config, tmp_path)
    try:
        wait_for(lambda: receiver.requests, 120, "the delivery after the restart", second)
        time.sleep(4)  # several more evaluations (every second): no second page may follow
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=30)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
        receiver.stop()
    assert second.returncode == 0, out[-2000:]
    assert "evaluator stopped" in out
    assert len(receiver.requests) == 1, [r.body for r in receiver.requests]
    seen = receiver.requests[0]
    assert seen.key == row["key"]
    body = json.loads(seen.body)
    assert (
        body["status"] == "firing" and body["alerts"][0]["annotations"]["summary"] == "small-0 has 7 requests waiting"
    )
    assert [r["status"] for r in outbox(db)] == ["delivered"]

    listed = run_cli("alerts", "list", "--config", str(config), cwd=tmp_path)
    assert listed.returncode == 0 and "firing" in listed.stdout and "QueueTooLong" in listed.stdout
