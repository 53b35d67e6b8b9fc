"""Benchmark: the collector's CPU per scraped sample at one load, two design changes side by side:
asyncio's event loop against uvloop's (``--compare loop``), and the writer's flush interval
(``--compare flush``: the default 1 s against inserts of 10 or 30 s of samples).

The design changes tried for the CPU per sample (issue 44). The profile (``bench/profile_ingest.py``)
puts the HTTP client and the event loop second after the exposition parse, and the parse is
already a dictionary lookup and a float conversion per sample; uvloop replaces the loop and its
socket transports in compiled code. With the in-process store, the insert and chDB's merges are
half the process's CPU: an insert of one second holds about one sample a series, so the raw
table and the 1-minute, 1-hour and 6-hour rollups each get a row for every sample and a part for
every insert, and the merges fold them later; a longer flush puts several samples of a series in
one insert (one rollup row for them) and makes fewer, larger parts. Same target server and
pipeline as ``bench_scrape_ingest`` (Scraper -> parser -> SeriesConverter -> Writer), the store
either the in-process chDB with its rollups (``--sink chdb``) or Null tables in another process
(``--sink remote``: the collector alone). The variants alternate (the order reversed every other
round) for ``--rounds`` rounds so the machine's drift falls on all, and each run's merges settle
before the next starts (they would be billed to it); each warms up, then measures ``--intervals``
intervals: CPU-seconds of this process per million samples, and (``--sink chdb``) the rows the
store counted as inserted per sample row written (its ``InsertedRows``: the Null ingest table's,
the raw table's, the rollups', the scrape log's). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_scrape_ingest import DATA, null_tables, run_level, start_targets  # noqa: E402
from bench.bench_warehouse import settle  # noqa: E402
from collector.config import BATCH_ROWS, FLUSH_INTERVAL_S  # noqa: E402

INSERTED = "fleetscope_collector_inserted_rows_total"  # the writer's rows inserted, per table
Variant = tuple[Callable[[], asyncio.AbstractEventLoop], dict[str, Any]]  # loop factory, WriterConfig options


def variants(compare: str, flushes: list[float], rows_per_s: float) -> dict[str, Variant]:
    """name -> (loop factory, writer options) of the design change compared. A flush longer than
    the default's gets room for its rows (``rows_per_s`` of them a second, twice over: the writer
    cuts a batch at ``batch_rows`` and spools a buffer past twice ``max_buffer_rows``); the default's
    is the collector's own configuration."""
    if compare == "loop":
        import uvloop

        return {"asyncio": (asyncio.new_event_loop, {}), "uvloop": (uvloop.new_event_loop, {})}
    out: dict[str, Variant] = {}
    for f in flushes:
        room = max(BATCH_ROWS, int(2 * f * rows_per_s))
        options = (
            {"flush_interval_s": f}
            if f <= FLUSH_INTERVAL_S
            else {"flush_interval_s": f, "batch_rows": room, "max_buffer_rows": room}
        )
        out[f"flush {f:g} s"] = (asyncio.new_event_loop, options)
    return out


def inserted_rows(client: Any) -> int:
    """The store's count of rows inserted so far (every table and view), 0 where it has none."""
    value = client.command("SELECT sum(value) FROM system.events WHERE event = 'InsertedRows'")
    return int(value or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=("loop", "flush"), default="loop", help="the design change compared")
    parser.add_argument("--flush", default="1,10,30", help="--compare flush: the flush intervals, seconds")
    parser.add_argument("--targets", type=int, default=400)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument(
        "--intervals",
        type=int,
        help="intervals measured a run (default 4; --compare flush: at least 4 of the longest flush)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sink", choices=("chdb", "remote"), default="chdb")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from prometheus_client import CollectorRegistry

    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    flushes = [float(f) for f in args.flush.split(",")]
    if args.intervals is None:  # a window of whole flushes: a short one holds 0 or 1 of the longest's inserts
        longest = max(flushes) if args.compare == "flush" else 0.0
        args.intervals = max(4, math.ceil(4 * longest / args.interval))
    from collector.exposition import parse

    per_target = len(parse(DATA.read_text()))  # samples a scrape of one target
    compared = variants(args.compare, flushes, args.targets * per_target / args.interval)
    port, server = start_targets()
    per_million: dict[str, list[float]] = {name: [] for name in compared}
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.sink == "remote":
                from bench.remote_store import RemoteStore

                client: Any = RemoteStore(f"{tmp}/ch", null_tables)
            else:
                client = connect(f"chdb:{tmp}/ch")
                clickhouse_runner.apply(client)
            print(f"{args.targets} targets at {args.interval:g}s, store: {args.sink}; {args.rounds} rounds")
            for round_ in range(args.rounds):
                names = list(compared) if round_ % 2 == 0 else list(compared)[::-1]
                for name in names:
                    factory, options = compared[name]
                    registry = CollectorRegistry()  # the writer's own count of the sample rows it inserted
                    spool = Path(tmp) / f"spool-{round_}-{len(runs)}"
                    writer = Writer(client, WriterConfig(spool_dir=spool, **options), registry=registry)
                    rows0 = inserted_rows(client) if args.sink == "chdb" else 0
                    writer.start()
                    with asyncio.Runner(loop_factory=factory) as runner:
                        r = runner.run(run_level(args.targets, port, args.interval, args.intervals, writer))
                    if not writer.close(60.0):  # flushes what is left: every row scraped is in the count below
                        print(f"  round {round_ + 1} {name}: the writer did not flush everything (rows left spooled)")
                    if args.sink == "chdb":  # this run's merges finish before the next one's clock starts
                        settle(client)
                    added = registry.get_sample_value(INSERTED, {"table": "samples"}) or 0.0
                    rows = (inserted_rows(client) - rows0) / added if args.sink == "chdb" and added else None
                    cpu_per_m = r["cpu"] / r["samples_per_s"] * 1e6
                    per_million[name].append(cpu_per_m)
                    runs.append(
                        {
                            "round": round_,
                            "variant": name,
                            **r,
                            "cpu_s_per_1m_samples": cpu_per_m,
                            "rows_written_per_sample": rows,
                        }
                    )
                    written = f"  {rows:4.2f} rows written a sample" if rows is not None else ""
                    print(
                        f"  round {round_ + 1} {name:<10} {r['samples_per_s']:>9,.0f} samples/s  cpu {r['cpu']:>5.0%}  "
                        f"{cpu_per_m:6.2f} CPU-s per 1M samples  missed {r['missed']}{written}",
                        flush=True,
                    )
            client.close()
    finally:
        server.terminate()
    medians = {name: statistics.median(values) for name, values in per_million.items()}
    first = next(iter(medians))
    print(
        "median CPU-s per 1M samples: "
        + ", ".join(f"{name} {m:.2f} ({m / medians[first]:.2f}x)" for name, m in medians.items())
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "medians": medians, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
