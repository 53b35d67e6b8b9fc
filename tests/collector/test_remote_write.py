"""Prometheus remote-write in: what a sender's bodies become (series, samples with their resets and
increases, scrapes rows), the answers a sender acts on (204, 4xx with the reason, 503 to retry), a
store outage without loss, and 1,000 fuzzed bodies without a crash — through the real receiver
into a real chDB store."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cramjam
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from collector.prompb import WriteRequest
from collector.remote_write import STALE_NAN, RemoteWriteConfig, RemoteWriteConverter, RemoteWriteError, decode
from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner
from tests.collector.test_writer import FlakyStore

T0 = 1_795_000_000_000  # ms
HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
STALE = __import__("struct").unpack("<d", STALE_NAN.to_bytes(8, "little"))[0]


def series(message: Any, name: str, points: list[tuple[int, float]], **labels: str) -> None:
    ts = message.timeseries.add()
    for key, value in sorted({"__name__": name, "job": "prom", "instance": "10.0.0.7:8000", **labels}.items()):
        ts.labels.add(name=key, value=value)
    for at, value in points:
        ts.samples.add(timestamp=at, value=value)


def body(message: Any) -> bytes:
    return bytes(cramjam.snappy.compress_raw(message.SerializeToString()))


def engine_request(start: int = 0, prompt: tuple[float, ...] = (100, 250), pod: str = "vllm-7f9c") -> Any:
    """What Prometheus sends for one engine: a counter, a histogram bucket, a gauge, its `up`."""
    m = WriteRequest()
    at = [T0 + (start + i) * 15_000 for i in range(len(prompt))]
    series(m, "vllm:prompt_tokens_total", list(zip(at, prompt, strict=True)), model_name="tiny", pod=pod)
    series(
        m,
        "vllm:time_to_first_token_seconds_bucket",
        list(zip(at, (3.0, 7.0), strict=True)),
        le="0.5",
        model_name="tiny",
        pod=pod,
    )
    series(m, "vllm:num_requests_running", list(zip(at, (4.0, 2.0), strict=True)), model_name="tiny", pod=pod)
    series(
        m, "vllm:gpu_cache_usage_perc", list(zip(at, (0.5, 0.6), strict=True)), model_name="tiny", pod=pod
    )  # an old name
    series(m, "up", [(a, 1.0) for a in at], pod=pod)
    series(m, "scrape_duration_seconds", [(a, 0.012) for a in at], pod=pod)
    series(m, "scrape_samples_scraped", [(a, 431.0) for a in at], pod=pod)
    return m


def convert(converter: RemoteWriteConverter, message: Any) -> dict[str, dict[str, list[Any]]]:
    batch, _counts = converter.convert(decode(body(message), HEADERS))
    return batch.tables


def test_a_prometheus_request_becomes_the_rows_a_scrape_makes() -> None:
    tables = convert(RemoteWriteConverter(RemoteWriteConfig(replica_labels=("pod", "instance"))), engine_request())
    labels = {m: ls for m, ls in zip(tables["series"]["metric"], tables["series"]["labels"], strict=True)}
    assert set(labels) == {
        "vllm:prompt_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",  # stored under vLLM's current name
    }
    assert labels["vllm:prompt_tokens_total"] == {
        "job": "prom",
        "instance": "10.0.0.7:8000",
        "model_name": "tiny",
        "pod": "vllm-7f9c",
        "replica": "vllm-7f9c",  # the first of replica_labels the series carries
    }
    samples = tables["samples"]
    by_metric = {m: [] for m in samples["metric"]}
    for m, value, increase in zip(samples["metric"], samples["value"], samples["increase"], strict=True):
        by_metric[m].append((value, increase))
    assert by_metric["vllm:prompt_tokens_total"] == [(100.0, 0.0), (250.0, 150.0)]
    assert by_metric["vllm:time_to_first_token_seconds_bucket"] == [(3.0, 0.0), (7.0, 4.0)]  # cumulative by name
    assert by_metric["vllm:num_requests_running"] == [(4.0, 0.0), (2.0, 0.0)]  # a gauge has no increase
    scrapes = tables["scrapes"]
    assert scrapes["replica"] == ["vllm-7f9c"] * 2 and scrapes["up"] == [1, 1]
    assert scrapes["duration_seconds"] == [0.012] * 2 and scrapes["samples_scraped"] == [431] * 2


def test_resets_resends_and_staleness_are_handled_as_for_a_scrape() -> None:
    converter = RemoteWriteConverter(prior={})
    convert(converter, engine_request(0, (100, 250)))
    # the engine restarted: the counter counts from zero again; the same batch arrives twice
    again = engine_request(2, (40, 90))
    first = convert(converter, again)["samples"]
    assert first["reset"][:2] == [250.0, 0.0] and first["increase"][:2] == [40.0, 50.0]
    resent = converter.convert(decode(body(again), HEADERS))[1]
    assert resent.samples == 0 and resent.duplicate == 14  # nothing counted twice
    stale = WriteRequest()
    series(stale, "vllm:prompt_tokens_total", [(T0 + 60_000, STALE)], model_name="tiny", pod="vllm-7f9c")
    batch, counts = converter.convert(decode(body(stale), HEADERS))
    assert counts.stale == 1 and not batch.tables["samples"]["ts"]


def test_after_a_collector_restart_the_first_increase_starts_from_the_stored_value() -> None:
    first = RemoteWriteConverter(prior={})
    tables = convert(first, engine_request(0, (100, 250)))
    fp = tables["samples"]["fingerprint"][0]
    restarted = RemoteWriteConverter(prior={fp: 250.0})
    again = convert(restarted, engine_request(2, (300, 330)))["samples"]
    assert again["increase"][:2] == [50.0, 30.0]


def test_an_old_vllm_name_beside_its_new_one_is_not_counted_twice() -> None:
    """During vLLM's deprecation releases an engine exposes both names: one series, one increase."""
    converter = RemoteWriteConverter(prior={})
    for start, values in ((0, (100.0, 150.0)), (2, (180.0, 260.0))):
        m = WriteRequest()
        at = [T0 + (start + i) * 15_000 for i in range(2)]
        for name in ("vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"):
            series(m, name, list(zip(at, values, strict=True)), model_name="tiny")
        tables = convert(converter, m)
        assert set(tables["samples"]["metric"]) == {"vllm:prefix_cache_queries_total"}
        assert len(tables["samples"]["ts"]) == 2  # the old name's samples dropped
    assert sum(tables["samples"]["increase"]) == 260.0 - 150.0
    assert converter.renamed == {"vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total"}


def test_a_series_that_comes_back_after_an_hour_counts_from_where_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import collector.remote_write as rw

    clock = [1_795_000_000.0]
    monkeypatch.setattr(rw.time, "time", lambda: clock[0])
    fp = convert(RemoteWriteConverter(), engine_request())["samples"]["fingerprint"][0]
    converter = RemoteWriteConverter(prior={fp: 1000.0})  # the store's value at the collector's start
    first = convert(converter, engine_request(0, (1000, 5000)))["samples"]
    assert first["fingerprint"][0] == fp
    clock[0] += 2 * 3600  # the sender went quiet: the series is forgotten ...
    convert(converter, engine_request(900, (10.0, 10.0), pod="another"))
    again = convert(converter, engine_request(1000, (6000, 6100)))["samples"]  # ... and comes back
    assert again["increase"][:2] == [1000.0, 100.0]  # from 5000, not from the start's 1000


def test_a_refused_request_changes_nothing() -> None:
    converter = RemoteWriteConverter()
    m = engine_request()
    m.metadata.add(type=2, metric_family_name="vllm:prompt_tokens_total")  # says: a gauge
    m.timeseries.add().samples.add(timestamp=T0, value=1.0)  # a series without a name
    with pytest.raises(RemoteWriteError):
        converter.convert(decode(body(m), HEADERS))
    # the same engine's good request afterwards: its counter still a counter, every series new
    tables = convert(converter, engine_request())
    assert len(tables["series"]["metric"]) == 4
    assert tables["samples"]["increase"][:2] == [0.0, 150.0]


def test_metadata_decides_what_is_a_counter() -> None:
    m = WriteRequest()
    series(m, "queue_total", [(T0, 5.0), (T0 + 15_000, 3.0)])  # a gauge that happens to end in _total
    meta = m.metadata.add(type=2, metric_family_name="queue_total")  # GAUGE
    assert meta.type == 2
    samples = convert(RemoteWriteConverter(), m)["samples"]
    assert samples["reset"] == [0.0, 0.0] and samples["increase"] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("raw", "headers", "status", "reason"),
    [
        (b"\x00garbage that is not snappy", HEADERS, 400, "not snappy"),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff\xff not protobuf")), HEADERS, 400, "not a protobuf"),
        (body(engine_request()), {**HEADERS, "Content-Encoding": "gzip"}, 415, "snappy"),
        (
            body(engine_request()),
            {**HEADERS, "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
            415,
            "2.0",
        ),
        (b"", HEADERS, 400, "empty body"),
    ],
)
def test_a_body_that_will_never_be_good_is_refused_with_the_reason(
    raw: bytes, headers: dict[str, str], status: int, reason: str
) -> None:
    with pytest.raises(RemoteWriteError) as caught:
        decode(raw, headers)
    assert caught.value.status == status and reason in caught.value.reason


def test_a_series_without_a_name_refuses_the_whole_request() -> None:
    m = engine_request()
    nameless = m.timeseries.add()
    nameless.labels.add(name="job", value="prom")
    nameless.samples.add(timestamp=T0, value=1.0)
    with pytest.raises(RemoteWriteError, match=r"series 8: no __name__ label \(labels: job='prom'\)"):
        RemoteWriteConverter().convert(decode(body(m), HEADERS))


# ---------------------------------------------------------------------------- the receiver


@pytest.fixture
def store(ch: Any) -> FlakyStore:
    clickhouse_runner.apply(ch)
    return FlakyStore(ch)


class Receiver:
    """The collector's HTTP receiver on a test server, writing to ``store``."""

    def __init__(self, store: FlakyStore, tmp_path: Path, **writer: Any) -> None:
        options = {"flush_interval_s": 0.05, "retry_initial_s": 0.05, "retry_max_s": 0.2, **writer}
        registry = CollectorRegistry()  # the writer's metrics and the receiver's on one /metrics
        self.writer = Writer(store, WriterConfig(spool_dir=tmp_path / "spool", **options), registry=registry)
        self.collector = Collector(CollectorConfig(grpc_port=0), self.writer, registry)
        self.loop = asyncio.new_event_loop()
        self.client = TestClient(TestServer(self.collector.app()), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())
        self.writer.start()

    def post(self, raw: bytes, headers: dict[str, str] = HEADERS) -> tuple[int, str]:
        async def go() -> tuple[int, str]:
            response = await self.client.post("/api/v1/write", data=raw, headers=headers)
            return response.status, await response.text()

        return self.loop.run_until_complete(go())

    def metrics(self) -> str:
        async def go() -> str:
            return await (await self.client.get("/metrics")).text()

        return self.loop.run_until_complete(go())

    def close(self) -> bool:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
        return self.writer.close(timeout_s=10)


@pytest.fixture
def receiver(store: FlakyStore, tmp_path: Path) -> Iterator[Receiver]:
    r = Receiver(store, tmp_path)
    yield r
    r.close()


def rows(store: FlakyStore, table: str = "samples") -> int:
    return int(store.client.query(f"SELECT count() FROM {table}").result_rows[0][0])


def test_bad_bodies_get_4xx_nothing_is_stored_and_the_receiver_keeps_serving(
    receiver: Receiver, store: FlakyStore
) -> None:
    nameless = engine_request()
    nameless.timeseries.add().samples.add(timestamp=T0, value=1.0)
    huge = WriteRequest()
    series(huge, "x_total", [(T0, 1.0)], blob="y" * 1000)
    bad = [
        (b"not snappy at all", HEADERS),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\xff\xff\xff\x0f")), HEADERS),
        (body(nameless), HEADERS),
        (body(engine_request()), {**HEADERS, "Content-Encoding": "identity"}),
    ]
    answers = [receiver.post(raw, headers) for raw, headers in bad]
    assert [status for status, _ in answers] == [400, 400, 400, 415]
    for encoding in ("gzip", "deflate"):  # the HTTP server inflates these itself: a bad one is a 400
        status, text = receiver.post(b"\x1f\x8b not what it says" * 5, {**HEADERS, "Content-Encoding": encoding})
        assert status == 400 and "cannot be read as its Content-Encoding says" in text
    assert "no __name__ label" in answers[2][1]
    receiver.collector.remote_write.converter.config = RemoteWriteConfig(max_decoded_bytes=500)
    status, text = receiver.post(body(huge))
    assert status == 413 and "over the limit of 500" in text
    receiver.collector.remote_write.converter.config = RemoteWriteConfig()
    assert receiver.writer.flush(force=True)
    assert rows(store) == 0 and rows(store, "series") == 0 and rows(store, "scrapes") == 0
    assert receiver.post(body(engine_request()))[0] == 204  # still serving
    assert 'fleetscope_collector_remote_write_requests_total{result="refused"} 7.0' in receiver.metrics()
    assert receiver.writer.flush(force=True)
    assert rows(store) == 8 and rows(store, "scrapes") == 2


def test_nothing_is_lost_across_a_store_outage(receiver: Receiver, store: FlakyStore) -> None:
    store.down = True
    for i in range(10):
        assert receiver.post(body(engine_request(2 * i, (100 + i, 110 + i))))[0] == 204  # spooled
    deadline = time.monotonic() + 10
    while receiver.writer.spool_size()[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows(store) == 0
    store.down = False
    assert receiver.writer.flush(force=True)
    deadline = time.monotonic() + 10
    while rows(store) < 80 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows(store) == 80 and rows(store, "scrapes") == 20


def test_a_nearly_full_spool_answers_503_so_the_sender_retries(store: FlakyStore, tmp_path: Path) -> None:
    receiver = Receiver(store, tmp_path, spool_max_bytes=40_000)
    try:
        store.down = True
        answers: list[int] = []
        deadline = time.monotonic() + 30
        while 503 not in answers:
            assert time.monotonic() < deadline, f"no 503 while the spool filled: {receiver.writer.spool_size()}"
            answers.append(receiver.post(body(engine_request(2 * len(answers))))[0])
            receiver.writer.spool_due(force=True)
            time.sleep(0.1)
        assert set(answers[:-1]) == {204} and len(answers) > 5
        assert 'fleetscope_collector_remote_write_requests_total{result="busy"} 1.0' in receiver.metrics()
        assert "fleetscope_collector_dropped_rows_total{" not in receiver.metrics()  # nothing thrown away
        assert "fleetscope_collector_write_lag_seconds" in receiver.metrics()
        store.down = False
        deadline = time.monotonic() + 30
        while receiver.post(body(engine_request(2 * len(answers))))[0] != 204:  # the sender's retry
            assert time.monotonic() < deadline, "the spool never drained"
            time.sleep(0.5)
    finally:
        assert receiver.close()
    assert rows(store, "scrapes") == 2 * len(answers)  # every 204's rows and the retried one's


# ---------------------------------------------------------------------------- fuzz


def mutate(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if op < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op < 0.6 and data:
            del data[rng.randrange(len(data)) :]
        elif op < 0.8:
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randint(1, 16))
        else:
            start = rng.randrange(len(data) + 1)
            data[start:start] = data[start : start + rng.randint(1, 64)]
    return bytes(data)


def test_1000_fuzzed_bodies_get_an_answer_and_store_only_named_series(receiver: Receiver, store: FlakyStore) -> None:
    rng = random.Random(41)
    plain = engine_request().SerializeToString()
    answers: dict[int, int] = {}
    for i in range(1000):
        if i % 3 == 0:  # a valid snappy frame of a damaged protobuf: the protobuf parser's turn
            raw = bytes(cramjam.snappy.compress_raw(mutate(rng, plain)))
        elif i % 3 == 1:  # a damaged snappy frame
            raw = mutate(rng, body(engine_request()))
        else:
            raw = rng.randbytes(rng.randint(0, 300))
        status, _text = receiver.post(raw)
        answers[status] = answers.get(status, 0) + 1
    assert set(answers) <= {204, 400, 413}, answers
    assert answers.get(400, 0) > 500  # most of it is refused
    assert receiver.post(body(engine_request(100)))[0] == 204  # and the receiver still serves
    assert receiver.writer.flush(force=True)
    names = store.client.query("SELECT DISTINCT metric FROM series").result_rows
    assert names and all(name and " " not in name for (name,) in names)
