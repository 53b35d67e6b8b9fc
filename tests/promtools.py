"""The Prometheus ecosystem's real binaries for tests: Prometheus, Alertmanager, vmagent, promtool, amtool.

In:  Debian's packages (``scripts/ensure-prometheus.sh`` installs them; ``make test`` runs it),
     a config a test writes.
Out: a started process on a free loopback port, its data and log in a temporary folder,
     ready (its readiness URL answered 200) and stopped when the ``with`` block ends.

A binary that is missing fails the test with what to run (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# the command -> where Debian puts it (Alertmanager's binary is prometheus-alertmanager)
BINARIES = {
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "vmagent": "vmagent",
    "promtool": "promtool",
    "amtool": "amtool",
}


def binary(name: str) -> str:
    """The path of one of ``BINARIES``; fails the test with the fix when it is not installed."""
    path = shutil.which(BINARIES[name])
    if path is None:
        pytest.fail(f"{BINARIES[name]} is not installed: run scripts/ensure-prometheus.sh (make test runs it)")
    return path


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together while chosen, so none is handed out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass
class Proc:
    """A started binary: its base URL and its log."""

    url: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def started(
    name: str,
    args: Sequence[str],
    workdir: Path,
    *,
    port: int,
    ready_path: str = "/-/ready",
    timeout_s: float = 60.0,
) -> Iterator[Proc]:
    """Run ``name`` with ``args`` (which listen on ``port``) until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary(name), *args], stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ}
        )
    proc = Proc(url, port, log, process)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(url + ready_path):
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}:\n{proc.log_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not ready at {url}{ready_path} after {timeout_s:g}s:\n{proc.log_text()}")
            time.sleep(0.2)
        yield proc
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
