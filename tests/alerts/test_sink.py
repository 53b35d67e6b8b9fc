"""The webhook sink: what fleetscope's receivers send arrives and reads as one line per alert; a
body that is not JSON is refused with 400 and said so; ``fleetscope alerts sink`` stops on
Ctrl-C and keeps the bodies it was asked to record."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from alerts.payloads import bodies
from alerts.sink import Sink
from tests.alerts.test_payloads import PAGERDUTY, SLACK, WEBHOOK, alert, notification


def test_each_receiver_type_reads_as_a_line_per_alert(tmp_path: Path) -> None:
    lines: list[str] = []
    with Sink(out=lines.append, record=tmp_path / "got.jsonl") as sink:
        for receiver in (WEBHOOK, SLACK, PAGERDUTY):
            n = notification(receiver.name, alert("small-1"), alert("small-2", "resolved"))
            for _key, body in bodies(receiver, n):
                assert httpx.post(sink.url, json=body).status_code == 200
        bad = httpx.post(sink.url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    webhook = [
        line for line in lines if "small-" in line and "KV cache 97% full" in line and "/alerts?replica=" in line
    ]
    assert any("FIRING" in line and "replica=small-1" in line for line in webhook)
    assert any("RESOLVED" in line and "replica=small-2" in line for line in webhook)
    assert any("TRIGGER" in line and "small-1" in line for line in lines)  # PagerDuty
    assert any("not JSON" in line for line in lines)
    recorded = [json.loads(x) for x in (tmp_path / "got.jsonl").read_text().splitlines()]
    assert len(recorded) == len(sink.received) == 1 + 1 + 2  # Alertmanager, Slack, 2 PagerDuty events
    assert recorded[0]["version"] == "4"


def test_the_command_prints_what_arrives_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "fleetscope"
    proc = subprocess.Popen(
        [str(exe), "alerts", "sink", "--port", "0", "--record", str(tmp_path / "got.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        first = proc.stderr.readline()
        url = re.search(r"webhook sink on (http://127\.0\.0\.1:\d+/)", first)
        assert url, first
        for _key, body in bodies(WEBHOOK, notification(WEBHOOK.name, alert("large-1"))):
            assert httpx.post(url.group(1), json=body, timeout=5).status_code == 200
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert re.search(r"FIRING\s+KVCacheSaturated \[page\] — model=tiny-small replica=large-1 — KV cache 97% full", out)
    assert "1 message(s) received" in err
    assert json.loads((tmp_path / "got.jsonl").read_text())["alerts"][0]["labels"]["replica"] == "large-1"
