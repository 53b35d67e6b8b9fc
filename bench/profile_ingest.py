"""Profile: where a scrape's and a span's CPU goes, stage by stage, at a fixed load.

Runs the real collector pipeline in this process against a fixed load, then splits the
process's CPU time into stages:

- the **event-loop thread** (HTTP, decompression, parsing, conversion, OTLP checking and
  decoding, queueing) and the **writer thread** (spool files, frames, the insert call, which runs
  chDB's parsing, the materialized views and the MergeTree write in that thread) are each
  profiled with cProfile; every function's own time is put in the stage its module belongs to,
  the profiles' timer is the thread's CPU clock (``time.thread_time``: waiting costs nothing), and
  each stage's share of the profile is applied to the thread's CPU time measured beside it. The
  profiler's own overhead is in those times, and it grows with Python calls: small on the
  ClickHouse-decoding path (34 us a span profiled, 28 unprofiled), 3-4x on Python decoding; the
  shares say where to look, the bench says how fast;
- what neither thread ran is **chDB's background work** (merges of the parts the inserts made):
  the process's CPU time minus the two threads'.

``--load scrape``: N simulated vLLM targets (the real exposition of bench/data, served by another
process) scraped every 5 s for a few intervals. ``--load otlp``: OTLP/HTTP exports of
``llm_request`` spans posted by another process, ``--decode clickhouse`` or ``python``. Not a test:
nothing is asserted. The figures go into docs/collector.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pstats
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAGES = (  # (stage, substrings of the code's file path), first match wins
    ("parse (exposition)", ("collector/exposition.py",)),
    ("convert (samples -> columns)", ("collector/convert.py",)),
    ("OTLP decode/check (Python)", ("collector/otlp", "google/protobuf", "google._upb", "opentelemetry/proto")),
    ("scrape loop", ("collector/scrape.py", "collector/targets.py")),
    ("receive/queue (collector)", ("collector/service.py", "collector/sampling.py")),
    (
        "spool (pickle, fsync, files)",
        ("collector/writer.py", "pickle", "pathlib", "posix.", "shutil", "_io.", "io.open"),
    ),
    ("frames (pandas)", ("pandas/",)),
    ("insert (clickhouse-connect + chDB: parse, views, MergeTree)", ("clickhouse_connect", "chdb")),
    ("numpy", ("numpy/",)),
    ("HTTP (aiohttp, asyncio, sockets)", ("aiohttp", "asyncio", "yarl", "multidict", "selectors", "socket", "ssl")),
    ("copying bytes", ("of 'bytes' objects", "of 'bytearray' objects")),
    ("decompress", ("gzip", "zlib")),
)


def stage_of(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for stage, marks in STAGES:
        if any(mark in where for mark in marks):
            return stage
    return "other (interpreter, logging, metrics)"


def split(profile: cProfile.Profile) -> dict[str, float]:
    """Each stage's share of the profile's own time (0-1)."""
    stats = pstats.Stats(profile)
    own: dict[str, float] = {}
    # the timer is the thread's CPU clock, so time a thread spends waiting (locks, sleeps) is ~0
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(filename, name)
        own[stage] = own.get(stage, 0.0) + tottime
    total = sum(own.values()) or 1.0
    if os.environ.get("PROFILE_OTHER"):  # which functions fell in "other": to refine STAGES
        rows = sorted(((t, f"{f}:{n}") for (f, _l, n), (_c, _n, t, _t, _x) in stats.stats.items()), reverse=True)  # type: ignore[attr-defined]
        for t, where in rows[:12]:
            print(f"    {t / total:6.1%} {stage_of(*where.rsplit(':', 1))[:20]:<20} {where[-110:]}")
    return {stage: t / total for stage, t in own.items()}


class ThreadClock:
    """CPU time and a cProfile of one thread, switched on and off from that thread."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile(time.thread_time)  # CPU time: waiting costs nothing
        self.cpu = 0.0
        self.running = False
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.thread_time()
        self.running = True
        self.profile.enable()

    def stop(self) -> None:
        if self.running:
            self.profile.disable()
            self.cpu += time.thread_time() - self._t0
            self.running = False


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Measure:
    """The measured span: set from the event loop; the writer thread's clock starts at its next
    flush after that and stops when the thread ends (``writer.close``)."""

    def __init__(self, writer) -> None:
        self.loop, self.writer = ThreadClock(), ThreadClock()
        self.cpu0 = 0.0
        self._on = threading.Event()
        flush, run = writer.flush, writer._run

        def measured_flush(force: bool = True) -> bool:
            if self._on.is_set() and not self.writer.running and threading.current_thread() is writer._thread:
                self.writer.start()
            return flush(force)

        def measured_run() -> None:
            try:
                run()
            finally:
                self.writer.stop()

        writer.flush, writer._run = measured_flush, measured_run

    def begin(self) -> None:
        self.cpu0 = process_cpu()
        self._on.set()
        self.loop.start()


async def scrape_load(args: argparse.Namespace, writer, measure: Measure) -> dict:
    from bench.bench_scrape_ingest import start_targets
    from collector.convert import Batch, SeriesConverter
    from collector.scrape import Scraper
    from collector.targets import make_target

    port, server = start_targets()
    converters: dict[str, SeriesConverter] = {}

    def sink(result) -> None:
        batch = Batch()
        converters.setdefault(result.target.key, SeriesConverter()).convert(result, batch)
        writer.add_tables(batch.tables)

    targets = [
        make_target(
            f"http://127.0.0.1:{port}/t/{i}/metrics",
            job="bench",
            labels={"replica": f"sim-{i}"},
            interval_s=args.interval,
            timeout_s=args.interval * 0.8,
        )
        for i in range(args.targets)
    ]
    scraper = Scraper(sink)
    scraper.set_targets(targets)
    await asyncio.sleep(2 * args.interval)  # warm-up: first scrapes fingerprint every series
    scrapes0, missed0 = scraper.scrapes, scraper.missed
    measure.begin()
    await asyncio.sleep(args.interval * args.intervals)
    measure.loop.stop()
    result = {"scrapes": scraper.scrapes - scrapes0, "missed": scraper.missed - missed0, "unit": "scrape"}
    await scraper.close()
    server.terminate()
    return result


async def otlp_load(args: argparse.Namespace, writer, measure: Measure) -> dict:
    from bench.bench_otlp_ingest import post_all
    from collector.service import Collector, CollectorConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    collector = Collector(CollectorConfig(http_port=port, grpc_port=0, otlp_decode=args.decode), writer)
    await collector.start()
    done: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    poster = multiprocessing.Process(target=post_all, args=(port, args.bodies, args.spans, 4, done))
    poster.start()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, done.get)  # bodies built
    measure.begin()
    await loop.run_in_executor(None, done.get)  # all answered
    measure.loop.stop()
    poster.join()
    while writer.pending_rows() or writer.spool_size()[0]:
        await asyncio.sleep(0.02)
    return {"spans": args.bodies * args.spans, "unit": "span", "native": collector.native_otlp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=("scrape", "otlp"), default="scrape")
    parser.add_argument("--targets", type=int, default=400, help="scrape: simulated targets")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--bodies", type=int, default=200, help="otlp: export requests")
    parser.add_argument("--spans", type=int, default=512, help="otlp: spans per export")
    parser.add_argument("--decode", choices=("clickhouse", "python"), default="clickhouse")
    parser.add_argument(
        "--store",
        choices=("chdb", "remote"),
        default="chdb",
        help="chdb: the in-process store (its inserts and merges counted); remote: a Null-engine "
        "store in another process (bench/remote_store.py: the collector alone)",
    )
    args = parser.parse_args()

    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    with tempfile.TemporaryDirectory() as tmp:
        if args.store == "remote":
            from bench.bench_otlp_ingest import null_sink
            from bench.bench_scrape_ingest import null_tables
            from bench.remote_store import RemoteStore

            client = RemoteStore(f"{tmp}/ch", null_tables if args.load == "scrape" else null_sink)
        else:
            client = connect(f"chdb:{tmp}/ch")
            clickhouse_runner.apply(client)
        writer = Writer(client, WriterConfig(spool_dir=Path(tmp) / "spool", batch_rows=100_000))
        measure = Measure(writer)
        if args.load == "scrape":
            writer.start()  # the OTLP collector starts it
        load = scrape_load if args.load == "scrape" else otlp_load
        result = asyncio.run(load(args, writer, measure))
        writer.close()
        total = process_cpu() - measure.cpu0
        client.close()
    units = result.get("scrapes") or result.get("spans") or 1
    loop_clock, writer_clock = measure.loop, measure.writer
    background = max(total - loop_clock.cpu - writer_clock.cpu, 0.0)
    what = f"{args.targets} targets every {args.interval:g}s" if args.load == "scrape" else f"{units:,} spans"
    if args.load == "otlp":
        what += f", decoded by {'ClickHouse' if result['native'] else 'Python'}"
    print(f"== {args.load}: {what}; CPU per {result['unit']} by stage (share of the process's CPU)")
    rows = [(f"loop thread: {s}", loop_clock.cpu * f) for s, f in split(loop_clock.profile).items()]
    rows += [(f"writer thread: {s}", writer_clock.cpu * f) for s, f in split(writer_clock.profile).items()]
    rows.append(("chDB background (merges) and other threads", background))
    if args.store == "remote":
        print("  (the store runs in another process: not counted here)")
    for name, seconds in sorted(rows, key=lambda r: -r[1]):
        if seconds / total >= 0.005:
            print(f"  {name:<80} {1e6 * seconds / units:>9.1f} µs {seconds / total:>6.1%}")
    print(f"  {'total':<80} {1e6 * total / units:>9.1f} µs   ({units / total:,.0f} {result['unit']}s per CPU-second)")
    if "missed" in result:
        print(f"  scrapes {result['scrapes']}, missed {result['missed']}")


if __name__ == "__main__":
    main()
