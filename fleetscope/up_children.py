"""The processes ``fleetscope up`` runs beside its own: the alert evaluator and the dashboard, each
with an interpreter of its own, so none waits for another's Python (the collector's parsing, a
page's pandas, a rule's evaluation) and a busy collector does not delay a cycle or a page.

In:  ``python -m fleetscope.up_children evaluator|dashboard [HOST PORT]`` with ``up``'s effective
     ``Settings`` pickled on stdin (its ``clickhouse.url``: the collector process's ClickHouse
     HTTP interface over chDB, ``storage.chdb_http``, or the ClickHouse server), then stdin held
     open as a lifeline: its end (``up`` stopping, or dying) stops the child.
Out: the evaluator evaluating the rules on their intervals and delivering the notifications; the
     Streamlit dashboard on HOST:PORT. On ``up``'s side: ``Child`` (``start``, ``alive``, ``stop``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["Child"]

ROOT = Path(__file__).resolve().parent.parent


class Child:
    """One child process of ``up``: started with the settings, stopped by closing its lifeline."""

    def __init__(self, kind: str, settings: Any, *args: str) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetscope.up_children", kind, *args],
            stdin=subprocess.PIPE,
            start_new_session=True,  # `up` stops it in its order, not the terminal's Ctrl-C at once
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(pickle.dumps(settings))
        self.proc.stdin.flush()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """End the lifeline and wait; SIGTERM, then SIGKILL, to one that does not go. Its exit code."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for sig, wait_s in ((None, timeout_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if sig is not None and self.proc.poll() is None:
                self.proc.send_signal(sig)
            try:
                return self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()


def _lifeline(stop: threading.Event) -> None:
    """Set ``stop`` when stdin ends (``up`` closed it, or is gone)."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(65536):
                pass
        finally:
            stop.set()

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _logging(level: str) -> None:
    """As ``up`` logs: WARNING and above, so a skipped evaluator cycle is seen in its output."""
    logging.basicConfig(
        level=max(logging.WARNING, logging.getLevelName(level)),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def run_evaluator(settings: Any) -> None:
    from alerts.config import rule_groups
    from alerts.evaluator import Evaluator
    from alerts.reading import Context
    from fleetscope.stores import open_clickhouse
    from storage.metadata import make_engine, make_sessionmaker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    _lifeline(stop)
    client = open_clickhouse(settings)
    sessions = make_sessionmaker(make_engine(settings.metadata.url))
    context = Context(client, sessions, settings.cost.weights())
    evaluator = Evaluator(rule_groups(settings.alerts), context, sessions, settings.alerts)
    evaluator.start()
    try:
        stop.wait()
    finally:
        evaluator.stop()
        client.close()


def run_dashboard(settings: Any, host: str, port: int) -> None:
    """Streamlit in this process's main thread, on the settings ``up`` handed over."""
    from streamlit.web import bootstrap

    from dashboard import context
    from dashboard.launch import preload
    from fleetscope.stores import open_clickhouse
    from storage.metadata import make_engine, make_sessionmaker

    def stores(s: Any) -> tuple[Any, Any]:
        return open_clickhouse(s), make_sessionmaker(make_engine(s.metadata.url))

    context.provide(context.Provider(settings=lambda: settings, stores=stores, reader=open_clickhouse))
    stop = threading.Event()
    _lifeline(stop)

    def stop_when_told() -> None:
        stop.wait()
        os.kill(os.getpid(), signal.SIGTERM)  # Streamlit's own handler stops it

    threading.Thread(target=stop_when_told, name="stopper", daemon=True).start()
    preload()  # the pages' imports before the first viewer
    gc.freeze()  # the libraries' objects out of Streamlit's collections (dashboard.launch says why)
    flags = {
        "server.address": host,
        "server.port": port,
        "server.headless": True,
        "browser.gatherUsageStats": False,
        "server.fileWatcherType": "none",
        "server.runOnSave": False,
        "runner.magicEnabled": False,
        "runner.postScriptGC": False,
        "client.toolbarMode": "minimal",
        "logger.level": "warning",
    }
    if hasattr(bootstrap, "_print_url"):  # `up` says where the dashboard is, once it answers
        bootstrap._print_url = lambda *_args, **_kwargs: None  # noqa: SLF001
    bootstrap.load_config_options(flag_options=flags)
    bootstrap.run(str(ROOT / "dashboard" / "app.py"), False, [], flags)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("evaluator", "dashboard") or (argv[0] == "dashboard" and len(argv) != 3):
        print("usage: python -m fleetscope.up_children evaluator|dashboard HOST PORT (started by `fleetscope up`)")
        return 2
    settings = pickle.load(sys.stdin.buffer)
    _logging(settings.log_level)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if argv[0] == "evaluator":
        run_evaluator(settings)
    else:
        run_dashboard(settings, argv[1], int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
