"""Real Prometheus and real vmagent scrape two simulated engines and remote-write to fleetscope,
while fleetscope scrapes the same engines itself: the stored series and their counter increases
must agree (within one scrape interval at the window's edges), across an engine restart.

Binaries: Debian's prometheus 2.42 and victoria-metrics 1.79 (vmagent), installed by
scripts/ensure-prometheus.sh; each started on a free loopback port with a config written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from collector.remote_write import RemoteWriteConfig
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.sim.engine import EngineConfig
from fleet.sim.server import SimFleet, SimReplica
from migrations import clickhouse_runner
from storage.clickhouse import connect
from tests.promtools import free_port, free_ports, started

pytestmark = pytest.mark.slow
IV = 1.0  # every scraper's interval, seconds
MODEL = "tiny-small"


class Fleet:
    """Two simulated engines under load, and a collector that scrapes them (job ``direct``) and
    takes remote-write, in one event loop on a thread of their own."""

    def __init__(self, ch: Any, spool: Path) -> None:
        *engine_ports, self.port = free_ports(3)
        self.replicas = [
            SimReplica(f"sim-{i}", MODEL, port, EngineConfig(num_blocks=512)) for i, port in enumerate(engine_ports)
        ]
        writer = Writer(ch, WriterConfig(spool_dir=spool, flush_interval_s=0.5), registry=CollectorRegistry())
        targets = [
            make_target(
                f"127.0.0.1:{r.port}",
                job="direct",
                labels={"replica": r.name, "model": MODEL},
                interval_s=IV,
                timeout_s=IV,
            )
            for r in self.replicas
        ]
        config = CollectorConfig(
            http_port=self.port,
            grpc_port=0,
            static_targets=targets,
            remote_write=RemoteWriteConfig(replica_labels=("pod", "instance")),
        )
        self.collector = Collector(config, writer)
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.stage = "not started"
        self.error: BaseException | None = None
        self.flushed: bool | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _load(self, replica: SimReplica) -> None:
        url = f"http://127.0.0.1:{replica.port}/v1/completions"
        async with httpx.AsyncClient(timeout=30) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):  # a restart fails the requests in flight
                    await client.post(url, json={"model": MODEL, "prompt": list(range(3, 203)), "max_tokens": 16})
                await asyncio.sleep(0.05)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        fleet = SimFleet(self.replicas)
        try:
            self.stage = "starting the simulated engines"
            await fleet.start()
            self.stage = "starting the collector"
            await self.collector.start()
        except BaseException as exc:  # noqa: BLE001 -- reported by __enter__, not lost on this thread
            self.error = exc
            self._ready.set()
            with contextlib.suppress(Exception):
                await fleet.stop()
            return
        load = [asyncio.create_task(self._load(r)) for r in self.replicas]
        self.stage = "running"
        self._ready.set()
        await self._stop.wait()
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        self.flushed = await self.collector.stop()
        await fleet.stop()

    def __enter__(self) -> Fleet:
        self.thread.start()
        assert self._ready.wait(120), f"the simulated fleet and the collector did not start: still {self.stage}"
        if self.error is not None:
            raise AssertionError(f"{self.stage} failed: {self.error!r}") from self.error
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(60)
        if not self.thread.is_alive():
            self.loop.close()  # closed here, not by the garbage collector in a later test

    def restart(self, index: int) -> None:
        httpx.post(f"http://127.0.0.1:{self.replicas[index].port}/sim/restart", timeout=10)

    def newest(self, job: str) -> float:
        return self.collector.remote_write.newest.get(job, 0.0)


def scrape_config(job: str, fleet: Fleet) -> list[dict[str, Any]]:
    """The same two engines, named by a ``pod`` label as Kubernetes discovery would."""
    return [
        {
            "job_name": job,
            "scrape_interval": f"{IV:g}s",
            "scrape_timeout": f"{IV:g}s",
            "static_configs": [
                {"targets": [f"127.0.0.1:{r.port}"], "labels": {"pod": r.name, "model": MODEL}} for r in fleet.replicas
            ],
        }
    ]


def prometheus(fleet: Fleet, workdir: Path) -> Any:
    port = free_port()
    config = {
        "global": {"scrape_interval": f"{IV:g}s"},
        "scrape_configs": scrape_config("prom", fleet),
        "remote_write": [
            {
                "url": f"http://127.0.0.1:{fleet.port}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
                "metadata_config": {"send": True, "send_interval": "5s"},
            }
        ],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    args = [
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return started("prometheus", args, workdir, port=port)


def vmagent(fleet: Fleet, workdir: Path) -> Any:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scrape.yml").write_text(json.dumps({"scrape_configs": scrape_config("vmagent", fleet)}))
    args = [
        f"-promscrape.config={workdir / 'scrape.yml'}",
        f"-remoteWrite.url=http://127.0.0.1:{fleet.port}/api/v1/write",
        f"-remoteWrite.tmpDataPath={workdir / 'queue'}",
        "-remoteWrite.flushInterval=1s",
        f"-httpListenAddr=127.0.0.1:{port}",
    ]
    return started("vmagent", args, workdir, port=port)


def wait_until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ch(chdb_dir: Path) -> Iterator[Any]:
    """One store for the module: the four views of the same engines land in it."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    client = connect(f"chdb:{chdb_dir}", database=database, create_database=True)
    clickhouse_runner.apply(client)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {database}")
    client.close()


@pytest.fixture(scope="module")
def observed(ch: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, float]]:
    """~25 s of the same two engines seen three ways; ``restart`` is when sim-1 restarted."""
    workdir = tmp_path_factory.mktemp("remote-write")
    marks: dict[str, float] = {}
    with Fleet(ch, workdir / "spool") as fleet, ExitStack() as senders:
        senders.enter_context(prometheus(fleet, workdir / "prometheus"))
        senders.enter_context(vmagent(fleet, workdir / "vmagent"))
        start = time.time()
        time.sleep(10)
        fleet.restart(1)
        marks["restart"] = time.time()
        time.sleep(12)
        end = time.time()
        # both senders must have delivered what they scraped up to `end` (Prometheus reads its WAL
        # in steps of up to 15 s) before they stop
        for job in ("prom", "vmagent"):
            wait_until(f"{job}'s samples up to the end", lambda job=job: fleet.newest(job) >= end, 60)
        time.sleep(2 * IV)  # the senders' other queues (shards) send their last batches too
        marks.update(start=start, end=end)
    assert fleet.flushed, "the collector could not flush everything to the store"
    yield marks


def increases(ch: Any, job: str, start: float, end: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Per cumulative series (metric, labels but job/pod/instance): the sum of its per-sample
    increases in (start, end], each the rise over the series' previous sample plus the value before
    a reset marked on it (``reset``), as the collector computes the increase it rolls up (the raw
    table keeps the values and the marks, not the increase: migration 0016)."""
    rows = ch.query(
        """
        SELECT s.metric, s.labels, sum(x.increase)
        FROM (
            SELECT fingerprint, ts,
                   if(n = 1 OR isNaN(value) OR isNaN(before), 0, value - before + reset) AS increase
            FROM (
                SELECT fingerprint, ts, value, reset,
                       lagInFrame(value) OVER (PARTITION BY fingerprint ORDER BY ts
                                               ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS before,
                       row_number() OVER (PARTITION BY fingerprint ORDER BY ts) AS n
                FROM samples
                WHERE fingerprint IN (SELECT fingerprint FROM series WHERE labels['job'] = {job:String})
            )
        ) AS x INNER JOIN series AS s ON s.fingerprint = x.fingerprint
        WHERE s.labels['job'] = {job:String}
          AND match(s.metric, '(_total|_bucket|_count|_sum)$')
          AND x.ts > fromUnixTimestamp64Milli({a:Int64}) AND x.ts <= fromUnixTimestamp64Milli({b:Int64})
        GROUP BY s.metric, s.labels
        """,
        parameters={"job": job, "a": int(start * 1000), "b": int(end * 1000)},
    ).result_rows
    return {(metric, key(labels)): float(total) for metric, labels, total in rows}


def key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in {"job", "pod", "instance"}))


@pytest.mark.parametrize("job", ["prom", "vmagent"])
def test_remote_written_series_equal_the_scraped_ones(ch: Any, observed: dict[str, float], job: str) -> None:
    def series(j: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        rows = ch.query(
            "SELECT metric, labels FROM series WHERE labels['job'] = {j:String} GROUP BY metric, labels",
            parameters={"j": j},
        ).result_rows
        return {(metric, key(labels)) for metric, labels in rows}

    direct, sent = series("direct"), series(job)
    assert len(direct) > 100  # vLLM's families on two replicas
    assert sent == direct, (
        f"only scraped: {sorted(direct - sent)[:5]}; only remote-written: {sorted(sent - direct)[:5]}"
    )
    replicas = {
        r for (r,) in ch.query(f"SELECT DISTINCT replica FROM series WHERE labels['job'] = '{job}'").result_rows
    }
    assert replicas == {"sim-0", "sim-1"}  # from the sender's `pod` label
    up = ch.query(
        "SELECT replica, count(), min(up) FROM scrapes WHERE job = {j:String} GROUP BY replica ORDER BY replica",
        parameters={"j": job},
    ).result_rows
    assert [r[0] for r in up] == ["sim-0", "sim-1"] and all(r[1] >= 15 and r[2] == 1 for r in up), up


@pytest.mark.parametrize("job", ["prom", "vmagent"])
def test_remote_written_increases_equal_the_scraped_ones(ch: Any, observed: dict[str, float], job: str) -> None:
    a, b = observed["start"] + 4 * IV, observed["end"] - 2 * IV
    assert a < observed["restart"] < b
    direct, sent = increases(ch, "direct", a, b), increases(ch, job, a, b)
    # what the edges can move: the senders sample the counters at other moments within an interval,
    # and on 2 busy cores a scrape's value is read up to a few hundred ms after its timestamp, so
    # each edge allows the scraped increase within two intervals of it (a mishandled reset moves
    # a token counter by hundreds: tried)
    around_a = increases(ch, "direct", a - 2 * IV, a + 2 * IV)
    around_b = increases(ch, "direct", b - 2 * IV, b + 2 * IV)
    tokens = [k for k in direct if k[0] == "vllm:generation_tokens_total"]
    assert len(tokens) == 2 and all(direct[k] > 100 for k in tokens)  # both engines did work
    restarted = next(k for k in tokens if ("replica", "sim-1") in k[1])
    assert sent[restarted] > 0  # a reset is not a negative increase
    wrong = {}
    for series_key, total in direct.items():
        allowed = around_a.get(series_key, 0.0) + around_b.get(series_key, 0.0) + 1e-6
        if abs(sent.get(series_key, 0.0) - total) > allowed:
            wrong[series_key] = (total, sent.get(series_key), allowed)
    assert not wrong, f"{len(wrong)} series differ, e.g. {list(wrong.items())[:3]}"
