"""A real local HTTP receiver for the alert tests: answers POSTs from a script, records each."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["ScriptedReceiver", "Seen"]


@dataclass(frozen=True)
class Seen:
    """One request as the receiver got it, and what it answered."""

    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    answered: int
    at: float  # time.monotonic(), for ordering only

    @property
    def key(self) -> str:
        return self.headers["idempotency-key"]


class ScriptedReceiver:
    """A real HTTP server answering POSTs from a script (then 200), recording every request."""

    def __init__(self, port: int = 0) -> None:
        self.script: deque[tuple[int, dict[str, str], str]] = deque()
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    status, headers, text = receiver.script.popleft() if receiver.script else (200, {}, "ok")
                    receiver.requests.append(
                        Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status, time.monotonic())
                    )
                data = text.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def answer(self, status: int, times: int = 1, headers: dict[str, str] | None = None, text: str = "") -> None:
        with self._lock:
            self.script.extend([(status, headers or {}, text)] * times)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def accepted(self) -> Counter[str]:
        """2xx answers per idempotency key."""
        return Counter(r.key for r in self.requests if 200 <= r.answered < 300)
