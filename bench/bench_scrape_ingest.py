"""Benchmark: end-to-end scrape ingest — how many vLLM targets one collector sustains at a 5 s
interval with zero missed scrapes.

Targets are served over loopback HTTP by a separate process (one aiohttp server, one path per
simulated target: the real vLLM exposition of bench/data, with values that change from scrape
to scrape). Each level warms up until an interval passes without a missed scrape (the first
scrape of a target parses and fingerprints every series: a start-up cost, not the steady
state), then runs the measured intervals. Two stores are measured side by side:
in-process chDB with the rollup views (on this 2-core machine the store's inserts and merges
share the CPU with the collector and the target server), and a Null-engine sink (the
collector's own cost, as when ClickHouse runs elsewhere). The
collector side is the real pipeline: Scraper -> exposition parser -> SeriesConverter ->
Writer -> chDB (a temporary store). For each target count it runs a few intervals and
reports scrapes, missed intervals, failed scrapes, samples/s written and CPU use; the
sustained figure is the largest count with no missed or failed scrape.

The reference printed beside it is the same pipeline's parse step done by prometheus_client's
parser (how many targets the parse alone would allow at the same interval, measured in this
run): it shows what the parser choice means for the collector. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"


def serve(port: int, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    from aiohttp import web

    text = DATA.read_text()
    lines = text.splitlines()
    rng = random.Random(1)
    # 64 bodies, each with about a tenth of its values changed, served in turn: values change
    # from scrape to scrape as on a live engine, without this process spending a core on it
    bodies = [
        (
            "\n".join(
                line
                if line.startswith("#") or rng.random() > 0.1
                else line.rsplit(" ", 1)[0] + f" {rng.random() * 100:.3f}"
                for line in lines
            )
            + "\n"
        ).encode()
        for _ in range(64)
    ]
    served = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        return web.Response(body=bodies[served % len(bodies)], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/t/{i}/metrics", handler)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def start_targets() -> tuple[int, multiprocessing.Process]:
    """The simulated targets' server in its own process: (port, process); terminate it when done."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, ready), daemon=True)
    server.start()
    ready.wait(10)
    time.sleep(0.5)
    return port, server


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_level(n: int, port: int, interval: float, intervals: int, writer) -> dict:
    from collector.convert import Batch, SeriesConverter
    from collector.scrape import Scraper
    from collector.targets import make_target

    converters: dict[str, SeriesConverter] = {}
    samples = 0

    def sink(result) -> None:
        nonlocal samples
        batch = Batch()
        converters.setdefault(result.target.key, SeriesConverter()).convert(result, batch)
        for table, cols in batch.tables.items():
            writer.add(table, cols)
        samples += result.samples

    targets = [
        make_target(
            f"http://127.0.0.1:{port}/t/{i}/metrics",
            job="bench",
            labels={"replica": f"sim-{i}"},
            interval_s=interval,
            timeout_s=interval * 0.8,
        )
        for i in range(n)
    ]
    scraper = Scraper(sink)
    scraper.set_targets(targets)
    # warm up until an interval passes without a missed or failed scrape (at most 6): the first
    # scrape of a target parses and fingerprints every series, and a collector's steady state
    # is the cached path; then the measured intervals
    warmup = 0
    while True:
        missed, failed = scraper.missed, scraper.failures
        await asyncio.sleep(interval)
        warmup += 1
        if (scraper.missed == missed and scraper.failures == failed) or warmup >= 6:
            break
    scrapes0, missed0, failed0, samples0 = scraper.scrapes, scraper.missed, scraper.failures, samples
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await asyncio.sleep(interval * intervals)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    result = {
        "targets": n,
        "scrapes": scraper.scrapes - scrapes0,
        "missed": scraper.missed - missed0,
        "failed": scraper.failures - failed0,
        "samples_per_s": (samples - samples0) / wall,
        "cpu": cpu / wall,
        "warmup_intervals": warmup,
        "warmup_missed": missed0,
        "warmup_failed": failed0,
    }
    await scraper.close()
    return result


def reference_parse_targets(interval: float) -> tuple[float, float]:
    """Targets per interval that parsing alone allows: prometheus_client vs ours (warm)."""
    from prometheus_client.parser import text_string_to_metric_families

    from collector.exposition import SeriesCache, parse

    text = DATA.read_text()

    def per_call(fn) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            fn()
            n += 1
        return (time.perf_counter() - t0) / n

    ref = per_call(lambda: sum(len(f.samples) for f in text_string_to_metric_families(text)))
    cache = SeriesCache()
    ours = per_call(lambda: parse(text, cache=cache))
    return interval / ref, interval / ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--intervals", type=int, default=3, help="intervals to run per level")
    parser.add_argument("--levels", default="400,600,800,1200,1600,2000", help="target counts to try, ascending")
    parser.add_argument(
        "--sinks",
        default="chdb,remote",
        help="stores to write to: chdb (in-process chDB: raw table + the rollup views), "
        "null (Null-engine tables in the same process: the collector and the store's parsing), "
        "remote (Null-engine tables in another process: the collector alone, as with a ClickHouse "
        "server elsewhere)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    port, server = start_targets()
    results: dict[str, dict] = {}
    try:
        for sink in args.sinks.split(","):
            results[sink] = run_sink(sink, port, args)
    finally:
        server.terminate()
    ref_targets, our_targets = reference_parse_targets(args.interval)
    for sink, r in results.items():
        print(
            f"sustained ({SINKS[sink]}): {r['sustained']} targets at {args.interval:g}s with zero missed or failed "
            f"scrapes = {r['samples_per_s']:,.0f} samples/s"
        )
    print(
        f"parse-only ceiling per core at {args.interval:g}s: prometheus_client {ref_targets:,.0f} targets, "
        f"ours {our_targets:,.0f} targets ({our_targets / ref_targets:.1f}x)"
    )
    print(
        "reference: Azure Monitor's managed Prometheus collector pod ingests about 50-58k samples/s (published figure)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "interval_s": args.interval,
                    "sinks": results,
                    "parse_only_targets": {"prometheus_client": ref_targets, "ours": our_targets},
                },
                indent=2,
            )
        )


SINKS = {
    "chdb": "in-process chDB, raw + rollups",
    "null": "in-process Null-engine sink",
    "remote": "collector alone, Null-engine store in another process",
}


def null_tables(client) -> None:
    """Same columns, nothing stored: ``samples``, ``series`` and ``scrapes`` as Null tables."""
    for table in ("samples", "series", "scrapes"):
        client.command(f"DROP TABLE IF EXISTS {table}_null")
        client.command(f"CREATE TABLE {table}_null AS {table} ENGINE = Null")
    views = client.query(
        "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine = 'MaterializedView'"
    ).result_rows
    for (view,) in views:
        client.command(f"DROP VIEW {view}")
    for table in ("samples", "series", "scrapes"):
        client.command(f"EXCHANGE TABLES {table} AND {table}_null")


def run_sink(sink: str, port: int, args: argparse.Namespace) -> dict:
    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    sustained, best_rate, levels = 0, 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        if sink == "remote":
            from bench.remote_store import RemoteStore

            client = RemoteStore(f"{tmp}/ch", null_tables)
        else:
            client = connect(f"chdb:{tmp}/ch")
            clickhouse_runner.apply(client)
        if sink == "null":  # same columns, nothing stored: the collector and the store's parsing
            null_tables(client)
        writer = Writer(client, WriterConfig(spool_dir=Path(tmp) / "spool"))
        writer.start()
        print(
            f"== {SINKS[sink]}: interval {args.interval:g}s, warm-up then {args.intervals} measured intervals per level"
        )
        print(f"{'targets':>8} {'warm-up':>8} {'scrapes':>8} {'missed':>7} {'failed':>7} {'samples/s':>11} {'cpu':>6}")
        for n in (int(x) for x in args.levels.split(",")):
            r = asyncio.run(run_level(n, port, args.interval, args.intervals, writer))
            levels.append(r)
            print(
                f"{r['targets']:>8} {r['warmup_intervals']:>8} {r['scrapes']:>8} {r['missed']:>7} {r['failed']:>7} "
                f"{r['samples_per_s']:>11,.0f} {r['cpu']:>5.0%}"
            )
            if r["missed"] or r["failed"]:
                break
            sustained, best_rate = n, r["samples_per_s"]
        writer.close()
        store_cpu = client.close()
    return {"sustained": sustained, "samples_per_s": best_rate, "levels": levels, "store_cpu_s": store_cpu}


if __name__ == "__main__":
    main()
