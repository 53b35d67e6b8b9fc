"""Writer on a real chDB store: batching, outage -> spool -> replay, crash replay without duplicates."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from collector.writer import Writer, WriterConfig, read_spool_file
from migrations import clickhouse_runner


class FlakyStore:
    """Fault injection (named as such): delegates to the real chDB client, but refuses inserts
    while ``down`` is set, as an unreachable ClickHouse server would."""

    def __init__(self, client) -> None:
        self.client = client
        self.down = False
        self.inserts = 0

    def insert_df(self, table, df, settings=None):
        if self.down:
            raise ConnectionRefusedError("ClickHouse unreachable (injected)")
        self.inserts += 1
        return self.client.insert_df(table, df, settings=settings)

    def query(self, sql, *args, **kwargs):
        if self.down:
            raise ConnectionRefusedError("ClickHouse unreachable (injected)")
        return self.client.query(sql, *args, **kwargs)


def scrape_rows(n: int, start: int = 0) -> dict[str, list]:
    return {
        "ts": [1_795_000_000.0 + i for i in range(start, start + n)],
        "job": ["vllm"] * n,
        "instance": [f"127.0.0.1:{8000 + i % 3}" for i in range(start, start + n)],
        "replica": [f"r{i % 3}" for i in range(start, start + n)],
        "up": [1] * n,
        "duration_seconds": [0.01] * n,
        "samples_scraped": [430] * n,
        "error": [""] * n,
    }


def count(ch, table: str = "scrapes") -> int:
    return ch.query(f"SELECT count() FROM {table}").result_rows[0][0]


@pytest.fixture
def store(ch):
    clickhouse_runner.apply(ch)
    return FlakyStore(ch)


def config(tmp_path: Path, **kw) -> WriterConfig:
    options = {"flush_interval_s": 0.05, "retry_initial_s": 0.05, "retry_max_s": 0.2, **kw}
    return WriterConfig(spool_dir=tmp_path / "spool", **options)


def test_rows_are_batched_into_few_inserts(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path, batch_rows=1000, flush_interval_s=60))
    for i in range(50):
        writer.add("scrapes", scrape_rows(20, start=i * 20))
    assert writer.flush(force=False)  # 1,000 rows waiting: one batch is due
    assert store.inserts == 1 and count(store.client) == 1000
    assert list((tmp_path / "spool").glob("*.batch")) == []


def test_outage_spools_then_replays_in_order_without_loss(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path, batch_rows=100))
    writer.start()
    store.down = True
    for i in range(10):
        writer.add("scrapes", scrape_rows(100, start=i * 100))
        time.sleep(0.03)
    deadline = time.monotonic() + 5
    while writer.spool_size()[0] < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.spool_size()[0] >= 5 and count(store.client) == 0
    store.down = False
    assert writer.close(timeout_s=10)
    assert count(store.client) == 1000
    assert store.client.query("SELECT uniqExact(ts) FROM scrapes").result_rows[0][0] == 1000
    assert writer.spool_size() == (0, 0)


def test_crash_after_insert_before_spool_cleanup_does_not_double_count(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path))
    writer.add("scrapes", scrape_rows(300))
    writer._cut("scrapes")  # the batch is on disk (write-ahead)
    (spooled,) = list((tmp_path / "spool").glob("*.batch"))
    saved = spooled.read_bytes()
    assert writer.flush()
    assert count(store.client) == 300
    # the process died after the insert but before the spool file was removed:
    spooled.write_bytes(saved)
    restarted = Writer(store, config(tmp_path))
    assert restarted.flush()
    assert count(store.client) == 300  # same deduplication token: the replay is dropped
    assert restarted.spool_size() == (0, 0)


def test_a_replayed_samples_batch_is_stored_and_rolled_up_once(store, tmp_path: Path) -> None:
    """Samples go in through the ingest table's views (migration 0016): a batch replayed after a
    crash (same token) is dropped by the raw table and by every rollup tier (migration 0017)."""
    n = 120  # one counter, a sample a second from 10:00:00, each 5 more than the one before
    samples = {
        "metric": ["vllm:generation_tokens_total"] * n,
        "fingerprint": [42] * n,
        "ts": [1_795_000_000.0 + i for i in range(n)],
        "value": [5.0 * i for i in range(n)],
        "reset": [0.0] * n,
        "increase": [0.0] + [5.0] * (n - 1),
    }
    writer = Writer(store, config(tmp_path))
    writer.add("samples", samples)
    writer._cut("samples")
    (spooled,) = list((tmp_path / "spool").glob("*.batch"))
    saved = spooled.read_bytes()
    assert writer.flush()
    spooled.write_bytes(saved)  # the process died after the insert, before the spool file went
    assert Writer(store, config(tmp_path)).flush()
    assert count(store.client, "samples") == n
    for tier in ("samples_1m", "samples_1h", "samples_6h"):
        got = store.client.query(f"SELECT sum(increase), sum(value_count) FROM {tier}").result_rows[0]
        assert got == (5.0 * (n - 1), n), tier


def test_spool_is_bounded_and_drops_are_counted(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path, spool_max_bytes=4000))
    store.down = True
    for i in range(20):
        writer.add("scrapes", scrape_rows(50, start=i * 50))
        writer._cut("scrapes")
    batches, size = writer.spool_size()
    assert size <= 4000 and batches < 20
    dropped = writer.metrics.dropped.labels("scrapes")._value.get()
    assert dropped == (20 - batches) * 50
    store.down = False
    assert writer.flush()
    assert count(store.client) == batches * 50


def test_buffers_go_to_disk_every_interval_while_inserts_back_off(store, tmp_path: Path) -> None:
    """Memory stays bounded and a crash during an outage loses at most one flush interval."""
    writer = Writer(store, config(tmp_path, batch_rows=100, retry_initial_s=5, retry_max_s=5))
    store.down = True
    writer.start()
    for i in range(20):
        writer.add("scrapes", scrape_rows(100, start=i * 100))
        time.sleep(0.05)
    time.sleep(0.2)
    assert writer.pending_rows() <= 200  # the rest is already on disk
    assert writer.spool_size()[0] >= 5
    store.down = False
    assert writer.close(timeout_s=10)
    assert count(store.client) == 2000


class OneMoreHiccup(FlakyStore):
    """Fault injection: after an outage, the store answers but refuses one insert with a
    'busy' error (as TOO_MANY_PARTS would), then works."""

    hiccups = 1

    def insert_df(self, table, df, settings=None):
        if not self.down and self.hiccups:
            self.hiccups -= 1
            raise RuntimeError("Code: 252. DB::Exception: Too many parts (300). (TOO_MANY_PARTS)")
        return super().insert_df(table, df, settings=settings)


def test_a_long_outage_then_a_busy_store_rejects_nothing(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    store = OneMoreHiccup(ch)
    writer = Writer(store, config(tmp_path, max_attempts=2))
    writer.add("scrapes", scrape_rows(10))
    store.down = True
    for _ in range(6):
        assert not writer.flush()
    store.down = False
    assert not writer.flush()  # busy, not bad data
    assert writer.flush()
    assert count(ch) == 10
    assert list((tmp_path / "spool" / "rejected").glob("*.batch")) == []


def test_a_batch_that_cannot_be_framed_is_set_aside_at_once(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path))
    bad = scrape_rows(3)
    bad["ts"][1] = 1e30  # far outside DateTime64
    writer.add("scrapes", bad)
    writer._cut("scrapes")
    writer.add("scrapes", scrape_rows(5, start=100))
    assert writer.flush()
    assert count(store.client) == 5
    assert len(list((tmp_path / "spool" / "rejected").glob("*.batch"))) == 1


def test_a_batch_the_store_refuses_is_set_aside(store, tmp_path: Path) -> None:
    writer = Writer(store, config(tmp_path, max_attempts=2))
    writer.add("no_such_table", {"x": [1, 2, 3]})
    writer.add("scrapes", scrape_rows(10))
    for _ in range(3):
        writer.flush()
    assert count(store.client) == 10
    rejected = list((tmp_path / "spool" / "rejected").glob("*.batch"))
    assert len(rejected) == 1 and read_spool_file(rejected[0])["table"] == "no_such_table"


def test_a_spool_file_from_the_previous_version_is_replayed(store, tmp_path: Path) -> None:
    # before out-of-band buffers a spool file was one plain pickle: an upgrade must not lose it
    spool = tmp_path / "spool"
    spool.mkdir()
    batch = {"table": "scrapes", "token": "old-version", "columns": scrape_rows(25)}
    (spool / "000000000007-scrapes-old-version.batch").write_bytes(pickle.dumps({"batches": [batch]}, protocol=5))
    writer = Writer(store, config(tmp_path))
    assert writer.flush()
    assert count(store.client) == 25 and writer.spool_size() == (0, 0)


def test_a_spooled_batch_replays_from_disk_with_its_arrays(store, tmp_path: Path) -> None:
    # numpy columns and the rest travel out of the pickle; a new process reads them back whole
    import numpy as np

    rows = scrape_rows(40)
    rows["ts"] = np.asarray(rows["ts"], dtype=np.float64)
    rows["up"] = np.asarray(rows["up"], dtype=np.uint8)
    writer = Writer(store, config(tmp_path))
    writer.add("scrapes", rows)
    writer.spool_due(force=True)
    (spooled,) = list((tmp_path / "spool").glob("*.batch"))
    assert read_spool_file(spooled)["batches"][0]["columns"]["ts"].tolist() == rows["ts"].tolist()
    assert Writer(store, config(tmp_path)).flush()  # the process that spooled it is gone
    assert count(store.client) == 40
    assert store.client.query("SELECT min(ts), max(ts) FROM scrapes").result_rows[0][1].timestamp() == rows["ts"][-1]
