"""Run ``fleetscope dashboard`` as a child process on a free loopback port, for the browser
tests and the render benchmark.

In:  the environment for the child (``FLEETSCOPE_*`` store URLs, a password), a working
     directory.
Out: ``Served`` (``url``, ``stop()``), answering ``/_stcore/health`` before it is returned; the
     child's output goes to ``dashboard-PORT.log`` in the working directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import AnyStr

import httpx

__all__ = ["Served", "free_port", "wait_healthy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[AnyStr], timeout_s: float) -> None:
    """Until the Streamlit server at ``url`` answers ``/_stcore/health``; ``RuntimeError`` when
    ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/_stcore/health", timeout=2).text == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"no answer within {timeout_s:.0f} s")


class Served:
    def __init__(self, cwd: Path, env: dict[str, str], *, timeout_s: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(cwd) / f"dashboard-{self.port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")} | env
        self._log = self.log_path.open("w")
        exe = Path(sys.executable).parent / "fleetscope"
        self.proc = subprocess.Popen(
            [str(exe), "dashboard", "--port", str(self.port)],
            cwd=cwd,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_healthy(self.url, self.proc, timeout_s)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"fleetscope dashboard: {exc}:\n{self.log_path.read_text()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:  # the whole process group: nothing it started may outlive it
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
