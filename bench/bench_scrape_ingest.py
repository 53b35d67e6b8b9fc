"""Benchmark: end-to-end scrape ingest — how many vLLM targets one collector sustains at a 5 s
interval with zero missed scrapes.

Targets are served over loopback HTTP by a separate process (one aiohttp server, one path per
simulated target, each the real vLLM exposition of bench/data with its own values). The
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
import multiprocessing
import random
import resource
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

    async def handler(request: web.Request) -> web.Response:
        # vary a few values per request, as a live engine does
        body = "\n".join(
            line if line.startswith("#") or rng.random() > 0.1 else line.rsplit(" ", 1)[0] + f" {rng.random() * 100:.3f}"
            for line in lines
        ) + "\n"
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/t/{i}/metrics", handler)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_level(n: int, port: int, interval: float, intervals: int, writer) -> dict:  # noqa: ANN001
    from collector.convert import Batch, SeriesConverter
    from collector.scrape import Scraper
    from collector.targets import make_target

    converters: dict[str, SeriesConverter] = {}
    samples = 0

    def sink(result) -> None:  # noqa: ANN001
        nonlocal samples
        batch = Batch()
        converters.setdefault(result.target.key, SeriesConverter()).convert(result, batch)
        for table, cols in batch.tables.items():
            writer.add(table, cols)
        samples += result.samples

    targets = [
        make_target(f"http://127.0.0.1:{port}/t/{i}/metrics", job="bench", labels={"replica": f"sim-{i}"},
                    interval_s=interval, timeout_s=interval * 0.8)
        for i in range(n)
    ]
    scraper = Scraper(sink)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    scraper.set_targets(targets)
    await asyncio.sleep(interval * intervals)
    await scraper.close()
    wall = time.perf_counter() - t0
    return {"targets": n, "scrapes": scraper.scrapes, "missed": scraper.missed, "failed": scraper.failures,
            "samples_per_s": samples / wall, "cpu": (cpu_seconds() - cpu0) / wall}


def reference_parse_targets(interval: float) -> tuple[float, float]:
    """Targets per interval that parsing alone allows: prometheus_client vs ours (warm)."""
    from prometheus_client.parser import text_string_to_metric_families

    from collector.exposition import SeriesCache, parse

    text = DATA.read_text()

    def per_call(fn) -> float:  # noqa: ANN001
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
    parser.add_argument("--levels", default="100,200,300,400,500,600,800", help="target counts to try, ascending")
    args = parser.parse_args()

    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, ready), daemon=True)
    server.start()
    ready.wait(10)
    time.sleep(0.5)
    sustained = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            client = connect(f"chdb:{tmp}/ch")
            clickhouse_runner.apply(client)
            writer = Writer(client, WriterConfig(spool_dir=Path(tmp) / "spool"))
            writer.start()
            print(f"interval {args.interval:g}s, {args.intervals} intervals per level, targets on loopback HTTP (pid {server.pid})")
            print(f"{'targets':>8} {'scrapes':>8} {'missed':>7} {'failed':>7} {'samples/s':>11} {'cpu':>6}")
            for n in (int(x) for x in args.levels.split(",")):
                r = asyncio.run(run_level(n, port, args.interval, args.intervals, writer))
                print(f"{r['targets']:>8} {r['scrapes']:>8} {r['missed']:>7} {r['failed']:>7} {r['samples_per_s']:>11,.0f} {r['cpu']:>5.0%}")
                if r["missed"] or r["failed"]:
                    break
                sustained = n
            writer.close()
            rows = client.query("SELECT count() FROM samples").result_rows[0][0]
            client.close()
    finally:
        server.terminate()
    ref_targets, our_targets = reference_parse_targets(args.interval)
    print(f"sustained: {sustained} targets at {args.interval:g}s with zero missed or failed scrapes ({rows:,} samples written)")
    print(f"parse-only ceiling per core at {args.interval:g}s: prometheus_client {ref_targets:,.0f} targets, "
          f"ours {our_targets:,.0f} targets ({our_targets / ref_targets:.1f}x)")


if __name__ == "__main__":
    main()
