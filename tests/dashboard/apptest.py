"""What the page tests share: the app's pages by url path (``dashboard.pages``), a page run under
Streamlit's AppTest with URL parameters, the bundled settings on the tests' chDB store, a
played run's window, the charts' data, and an alert history written through the alerting
package's own writers."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from streamlit.testing.v1 import AppTest

from alerts import outbox
from alerts.model import fingerprint, parse_matchers
from alerts.state import Instance, Transition
from alerts.store import add_silence, save_evaluation, save_states, write_events
from dashboard import pages
from fleetscope.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p.url_path for p in pages.PAGES]  # every page of the app (dashboard.pages), by the url path run() takes
TITLES = {p.url_path: p.title for p in pages.PAGES}
FILES = {p.url_path: p.path for p in pages.PAGES}


def run(page: str, **params: str) -> AppTest:
    # earlier tests' garbage is collected here, not inside the script's compile: a finalizer that logs a
    # traceback parses source (traceback's caret anchors), and a parse nested in Streamlit's parse of the
    # page fails with "SystemError: AST constructor recursion depth mismatch" on Python 3.11.7
    # (CPython gh-106905; CI, 2026-12-06: a simulated engine's request handlers destroyed by the collector)
    gc.collect()
    at = AppTest.from_file(str(FILES[page]), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def on_store(chdb_dir):
    """The bundled settings, with clickhouse.url on the tests' chDB store (the SQL page's runner opens it)."""
    return load_settings(ROOT / "fleetscope.yaml", environ={"FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{chdb_dir}"})


def window(run_) -> dict[str, str]:
    return {"from": run_.start.isoformat(), "to": run_.end.isoformat()}


def chart_frames(at: AppTest) -> list:
    """The data of every chart on the page, as pandas frames."""
    return [
        pa.ipc.open_stream(d.data.data).read_all().to_pandas()
        for chart in at.get("vega_lite_chart")
        for d in chart.proto.datasets
        if d.data.data
    ]


def seed_alerts(ch, sessions) -> datetime:
    """Through the alerting package's own writers: two firing instances, one pending, one resolved; the firing
    one's state changes in ClickHouse; one delivered and one failed notification; one active silence."""
    now = datetime.now(UTC)

    def inst(labels: dict[str, str], state: str, summary: str, value: float | None, began: timedelta) -> Instance:
        at = now - began
        return Instance(
            fingerprint(labels),
            labels,
            {"summary": summary},
            state,
            value,
            active_at=at,
            fired_at=at if state in ("firing", "resolved") else None,
            last_true_at=now - timedelta(seconds=15),
            resolved_at=now - timedelta(minutes=2) if state == "resolved" else None,
            evaluated_at=now,
        )

    kv = {"alertname": "KVCacheSaturated", "replica": "small-0", "severity": "page"}
    kv1 = {**kv, "replica": "small-1"}
    ttft = {"alertname": "TTFTOverSLO", "model": "tiny-small", "metric": "ttft", "slo": "ttft p99 < 1s"}
    itl = {"alertname": "ITLOverSLO", "model": "tiny-large", "metric": "itl", "slo": "itl p99 < 50ms"}
    save_states(
        sessions,
        {
            "KVCacheSaturated": {
                fingerprint(kv): inst(kv, "firing", "KV cache of small-0 at 97%", 0.97, timedelta(minutes=20)),
                fingerprint(kv1): inst(kv1, "firing", "KV cache of small-1 at 95%", 0.95, timedelta(minutes=5)),
            },
            "TTFTOverSLO": {
                fingerprint(ttft): inst(
                    ttft, "pending", "time to first token of tiny-small at 1.4x its SLO", 1.4, timedelta(minutes=1)
                )
            },
            "ITLOverSLO": {
                fingerprint(itl): inst(
                    itl, "resolved", "inter-token latency of tiny-large back", 0.8, timedelta(minutes=30)
                )
            },
        },
    )
    began = now - timedelta(minutes=20)
    write_events(
        ch,
        [
            (
                "KVCacheSaturated",
                Transition(
                    fingerprint(kv), kv, {"summary": "KV cache of small-0 at 97%"}, "inactive", "pending", 0.97, began
                ),
            ),
            (
                "KVCacheSaturated",
                Transition(
                    fingerprint(kv),
                    kv,
                    {"summary": "KV cache of small-0 at 97%"},
                    "pending",
                    "firing",
                    0.97,
                    began + timedelta(minutes=1),
                ),
            ),
        ],
    )
    outbox.enqueue(
        sessions, "route0:kv:1", "ops-slack", {"text": "KVCacheSaturated firing"}, now - timedelta(minutes=19)
    )
    outbox.mark_delivered(sessions, "route0:kv:1", now - timedelta(minutes=19), 200)
    outbox.enqueue(sessions, "route0:kv:2", "oncall-pd", {"routing_key": "SECRET"}, now - timedelta(minutes=10))
    outbox.mark_failed(sessions, "route0:kv:2", 400, "HTTP 400: invalid routing key")
    add_silence(
        sessions,
        parse_matchers('alertname="KVCacheSaturated", replica="small-1"'),
        now - timedelta(minutes=3),
        now + timedelta(hours=1),
        "ana",
        "draining small-1 for a driver update",
    )
    save_evaluation(sessions, "capacity", now - timedelta(seconds=5), 0.042, 3, {})
    save_evaluation(
        sessions,
        "team-sql",
        now - timedelta(seconds=9),
        0.01,
        1,
        {"QueueSQL": "SQL failed: Code: 60. Unknown table default.queue"},
    )
    return now
