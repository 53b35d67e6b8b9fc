"""A local webhook receiver that prints what fleetscope's alerts send: the far end of the alert
path, for the demo (``fleetscope up``) and for trying a receiver before pointing it at a pager.

In:  POSTed JSON bodies on any path: Alertmanager v4 messages (``webhook`` receivers), Slack
     incoming-webhook messages (``{"text": ...}``), PagerDuty Events v2 events, or any JSON.
Out: ``describe(body)`` -> one line per alert ("FIRING KVCacheSaturated model=... — summary —
     link"); ``Sink`` serves on a loopback port, prints those lines with the arrival time, keeps
     the bodies (``received``) and appends each to ``record`` as a JSON line. A body that is not
     JSON is answered 400 and printed as such; one over ``MAX_BODY`` bytes, 413.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["MAX_BODY", "Sink", "describe"]

MAX_BODY = 1 << 20
_HIDDEN = {"alertname", "severity"}  # shown on their own, not among the labels


def _labels(labels: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _HIDDEN)


def describe(body: Any) -> list[str]:
    """What a person should read of one received body, a line per alert."""
    if isinstance(body, dict) and isinstance(body.get("alerts"), list):  # Alertmanager v4 (fleetscope's webhook)
        lines = []
        for alert in body["alerts"]:
            labels = alert.get("labels") or {}
            notes = alert.get("annotations") or {}
            parts = [
                f"{str(alert.get('status', '?')).upper():<8} {labels.get('alertname', '?')}"
                + (f" [{labels['severity']}]" if labels.get("severity") else ""),
                _labels(labels),
            ]
            parts += [notes.get("summary") or notes.get("description") or "", alert.get("generatorURL") or ""]
            lines.append(" — ".join(p for p in parts if p))
        return lines or [f"{str(body.get('status', '?')).upper()} (no alerts in the message)"]
    if isinstance(body, dict) and isinstance(body.get("text"), str):  # Slack
        return [line for line in body["text"].splitlines() if line.strip()] or ["(empty Slack message)"]
    if isinstance(body, dict) and "event_action" in body:  # PagerDuty Events v2
        payload = body.get("payload") or {}
        summary = payload.get("summary") or body.get("dedup_key", "")
        return [
            f"{str(body['event_action']).upper():<8} {summary}"
            + (f" [{payload['severity']}]" if payload.get("severity") else "")
        ]
    text = json.dumps(body, separators=(",", ":"), default=str)
    return [text if len(text) <= 300 else text[:297] + "..."]


class Sink:
    """A webhook receiver on ``host:port`` (0: a free port) printing what arrives through ``out``."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, out: Callable[[str], None] = print, record: Path | None = None
    ) -> None:
        self.out, self.record = out, record
        self.received: list[Any] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                if size > MAX_BODY:
                    sink._say(f"refused a body of {size} bytes (over {MAX_BODY})")
                    self._answer(413, {"error": f"body over {MAX_BODY} bytes"})
                    return
                raw = self.rfile.read(size)
                try:
                    body = json.loads(raw or b"null")
                except ValueError as exc:
                    sink._say(f"not JSON on {self.path} ({exc}): {raw[:120]!r}")
                    self._answer(400, {"error": f"not JSON: {exc}"})
                    return
                sink._take(body)
                self._answer(200, {"status": "ok"})

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:  # the lines above say what came; no access log
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{str(host)}:{port}/"  # a str: the server was bound to (host, port)

    def _say(self, line: str) -> None:
        self.out(f"{datetime.now(UTC):%H:%M:%S} {line}")

    def _take(self, body: Any) -> None:
        with self._lock:
            self.received.append(body)
            if self.record is not None:
                with self.record.open("a") as f:
                    f.write(json.dumps(body, default=str) + "\n")
            for line in describe(body):
                self._say(line)

    def start(self) -> Sink:
        self._thread = threading.Thread(target=self._server.serve_forever, name="alerts-sink", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
