"""Benchmark: the collector's CPU per scraped sample at one load, on asyncio's event loop and on
uvloop's (libuv), side by side.

The design change tried for the CPU per sample (issue 44): the profile (``bench/profile_ingest.py``)
puts the HTTP client and the event loop second after the exposition parse, and the parse is
already a dictionary lookup and a float conversion per sample; uvloop replaces the loop and its
socket transports in compiled code. Same target server and pipeline as ``bench_scrape_ingest``
(Scraper -> parser -> SeriesConverter -> Writer), the store either the in-process chDB with its
rollups (``--sink chdb``) or Null tables in another process (``--sink remote``: the collector
alone). The loops alternate for ``--rounds`` rounds so the machine's drift falls on both; each
round warms up, then measures ``--intervals`` intervals: CPU-seconds of this process per million
samples. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_scrape_ingest import null_tables, run_level, start_targets  # noqa: E402


def loops() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    import uvloop

    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=400)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sink", choices=("chdb", "remote"), default="chdb")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    port, server = start_targets()
    per_million: dict[str, list[float]] = {name: [] for name in loops()}
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.sink == "remote":
                from bench.remote_store import RemoteStore

                client: Any = RemoteStore(f"{tmp}/ch", null_tables)
            else:
                client = connect(f"chdb:{tmp}/ch")
                clickhouse_runner.apply(client)
            writer = Writer(client, WriterConfig(spool_dir=Path(tmp) / "spool"))
            writer.start()
            print(f"{args.targets} targets at {args.interval:g}s, store: {args.sink}; {args.rounds} rounds")
            for round_ in range(args.rounds):
                for name, factory in loops().items():
                    with asyncio.Runner(loop_factory=factory) as runner:
                        r = runner.run(run_level(args.targets, port, args.interval, args.intervals, writer))
                    cpu_per_m = r["cpu"] / r["samples_per_s"] * 1e6
                    per_million[name].append(cpu_per_m)
                    runs.append({"round": round_, "loop": name, **r, "cpu_s_per_1m_samples": cpu_per_m})
                    print(
                        f"  round {round_ + 1} {name:<8} {r['samples_per_s']:>9,.0f} samples/s  cpu {r['cpu']:>5.0%}  "
                        f"{cpu_per_m:6.2f} CPU-s per 1M samples  missed {r['missed']}"
                    )
            writer.close()
            client.close()
    finally:
        server.terminate()
    medians = {name: statistics.median(values) for name, values in per_million.items()}
    print(
        f"median CPU-s per 1M samples: asyncio {medians['asyncio']:.2f}, uvloop {medians['uvloop']:.2f} "
        f"(uvloop / asyncio {medians['uvloop'] / medians['asyncio']:.2f})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "medians": medians, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
