"""A hand-written autoscaled fleet in a chDB store: engine samples, scrape attempts and the
``scale_events`` rows of the autoscaler, for the elasticity analytics and the scaling rules.

The fleet, scraped every 15 s from minute -1 (``at(-1)``) to minute 70, window [T0, T0 + 1 h):
- small-0 (tiny-small, L4 $0.80, 1 GPU): up throughout, KV cache 0.9;
- large-0 (tiny-large, H100 $2.00, 2 GPUs): up throughout, KV cache 0.4;
- large-1 (tiny-large, H100, 2 GPUs): first scraped at minute 20, last at minute 40 (KV 0.2); the
  attempts from 40:15 to 42:00 fail (connection refused: its engine stopped before its target
  left the collector);
- ghost (tiny-small): scraped (no samples) from minute 30 to 40, then failing: a replica that
  went down on its own, with no scale event.
The autoscaler's events (``fleet.autoscale.events.ScaleEvent`` rows, the contract's own):
- d1 18:30 scale_out tiny-large 1 -> 2, kv_cache_usage 0.86 > 0.8 crossed at 18:15;
  large-1 ready 19:50, serving (first token) 20:05;
- d3 39:00 scale_in 2 -> 1 (kv_cache_usage 0.12 < 0.3) of large-1: draining 39:05, removed 40:20;
- d2 50:00 scale_out 1 -> 2 (crossed 49:30): large-2 ready 51:00 and never serving;
- d4 55:00 held_at_max 2 -> 2 (kv_cache_usage 0.9 > 0.8, max_replicas 2);
- d5 62:00 scale_in 2 -> 1 (of large-2).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.autoscale.events import ScaleEvent
from migrations import clickhouse_runner

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
WINDOW = (T0, T0 + timedelta(hours=1))
PRICES = {"H100": 2.00, "L4": 0.80}
# name, model, gpu, gpus, first minute, last minute, KV cache usage
REPLICAS = [
    ("small-0", "tiny-small", "L4", "1", -1.0, 70.0, 0.9),
    ("large-0", "tiny-large", "H100", "2", -1.0, 70.0, 0.4),
    ("large-1", "tiny-large", "H100", "2", 20.0, 40.0, 0.2),
]


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def exposition(model: str, kv: float) -> str:
    labels = f'{{model_name="{model}"}}'
    return "".join(
        f"# TYPE {name} {kind}\n{name}{labels} {value}\n"
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", 1),
            ("vllm:kv_cache_usage_perc", "gauge", kv),
        )
    )


def scrapes(
    writer: Writer, name: str, model: str, gpu: str, gpus: str, minutes: list[float], render: Any, error: str = ""
) -> None:
    target = make_target(
        f"{name}.fleet:8000",
        job="vllm",
        interval_s=15,
        timeout_s=5,
        labels={"replica": name, "model": model, "gpu_type": gpu, "gpu_count": gpus},
    )
    converter, batch = SeriesConverter(), Batch()
    for minute in minutes:
        text = render(minute) if render else ""
        result = ScrapeResult(
            target, at(minute).timestamp(), not error, 0.01, len(text.splitlines()) // 2, error,
            parse(text) if not error else None,
        )  # fmt: skip
        converter.convert(result, batch)
    writer.add_tables(batch.tables)


def every_15s(first: float, last: float) -> list[float]:
    return [first + i / 4 for i in range(int((last - first) * 4) + 1)]


def events() -> list[ScaleEvent]:
    def t(minute: float) -> float:
        return at(minute).timestamp()

    d1 = ScaleEvent(t(18.5), "tiny-large", "scale_out", "d1", "", 1, 2, "kv_cache_usage", 0.86, 0.8, t(18.25),
                    "sim", "kv_cache_usage 0.86 > 0.8 for 15s")  # fmt: skip
    d3 = ScaleEvent(t(39), "tiny-large", "scale_in", "d3", "large-1", 2, 1, "kv_cache_usage", 0.12, 0.3, t(37),
                    "sim", "kv_cache_usage 0.12 < 0.3 for 120s")  # fmt: skip
    d2 = ScaleEvent(t(50), "tiny-large", "scale_out", "d2", "large-2", 1, 2, "kv_cache_usage", 0.9, 0.8, t(49.5),
                    "sim", "kv_cache_usage 0.9 > 0.8 for 15s")  # fmt: skip
    d4 = ScaleEvent(t(55), "tiny-large", "held_at_max", "d4", "", 2, 2, "kv_cache_usage", 0.9, 0.8, t(54.5),
                    "sim", "kv_cache_usage 0.9 > 0.8 for 30s, but the pool is at max_replicas 2")  # fmt: skip
    d5 = ScaleEvent(t(62), "tiny-large", "scale_in", "d5", "large-2", 2, 1, "kv_cache_usage", 0.1, 0.3, t(60),
                    "sim", "kv_cache_usage 0.1 < 0.3 for 120s")  # fmt: skip
    return [
        d1, d1.step("ready", t(19 + 50 / 60), "large-1"), d1.step("serving", t(20 + 5 / 60), "large-1"),
        d3, d3.step("draining", t(39 + 5 / 60)), d3.step("removed", t(40 + 20 / 60)),
        d2, d2.step("ready", t(51)), d4, d5,
    ]  # fmt: skip


def insert_events(client: Any, rows: list[ScaleEvent]) -> None:
    def when(ts: float | None) -> datetime | None:
        return None if ts is None else datetime.fromtimestamp(ts, UTC)

    df = pd.DataFrame([e.row() for e in rows])
    df["ts"] = [when(v) for v in df["ts"]]
    df["crossed_at"] = pd.Series([when(None if pd.isna(v) else v) for v in df["crossed_at"]], dtype=object)
    client.insert_df("scale_events", df)


def autoscaled_fleet(client: Any, spool: Path, *, removed: bool = True) -> None:
    """The fleet above in ``client``'s database (migrated here). ``removed=False``: without
    large-1's ``removed`` event (a replica that went away on its own)."""
    clickhouse_runner.apply(client)
    writer = Writer(client, WriterConfig(spool_dir=spool))
    for name, model, gpu, gpus, first, last, kv in REPLICAS:
        scrapes(writer, name, model, gpu, gpus, every_15s(first, last), lambda _m, m=model, k=kv: exposition(m, k))
    scrapes(writer, "large-1", "tiny-large", "H100", "2", every_15s(40.25, 42), None, error="connection refused")
    scrapes(writer, "ghost", "tiny-small", "L4", "1", every_15s(30, 40), lambda _m: "")
    scrapes(writer, "ghost", "tiny-small", "L4", "1", every_15s(40.25, 70), None, error="connection refused")
    assert writer.flush()
    rows = events()
    insert_events(client, [e for e in rows if removed or e.kind != "removed"])
