"""Benchmark: remote-write ingest, samples per CPU-second, beside the scrape path on the same samples.

The same samples reach the collector two ways: scraped (the exposition text of a vLLM engine,
bench/data, parsed by ``collector.exposition`` and converted by ``SeriesConverter``) and
remote-written (the same series and values as Prometheus would send them: ``WriteRequest``s of
``--per-request`` samples, snappy-compressed, decoded by ``collector.remote_write.decode`` and
converted by ``RemoteWriteConverter``). Both end in the same column batches for the same writer,
so the figure compared is the collector's CPU per sample up to that point. Each round runs
both paths on fresh state over ``--targets`` targets x ``--scrapes`` scrapes (about a tenth of the
values changed per scrape, as on a live engine); the first scrape of each target (parse caches,
fingerprints) is left out of both, as a start-up cost. Rounds alternate the two paths.
The sender's side (building and compressing the requests) is not counted.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"
HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


def bodies(scrapes: int, rng: random.Random) -> list[str]:
    """One exposition per scrape, about a tenth of its values changed each time."""
    lines = DATA.read_text().splitlines()
    out = []
    for _ in range(scrapes):
        out.append(
            "\n".join(
                line
                if line.startswith("#") or rng.random() > 0.1
                else line.rsplit(" ", 1)[0] + f" {rng.random() * 100:.3f}"
                for line in lines
            )
            + "\n"
        )
    return out


def scrape_path(texts: list[str], targets: int) -> tuple[float, int]:
    """CPU seconds and samples for parse + convert of every (scrape, target) but the first scrape."""
    from collector.convert import Batch, SeriesConverter
    from collector.exposition import SeriesCache, parse
    from collector.scrape import ScrapeResult
    from collector.targets import make_target

    state = [
        (
            make_target(
                f"10.0.{i // 250}.{i % 250}:8000", job="vllm", labels={"pod": f"vllm-{i}"}, interval_s=15, timeout_s=10
            ),
            SeriesCache(),
            SeriesConverter({}),
        )
        for i in range(targets)
    ]
    cpu = 0.0
    samples = 0
    for n, text in enumerate(texts):
        t0 = time.process_time()
        for target, cache, converter in state:
            exposition = parse(text, "text/plain; version=0.0.4", cache)
            result = ScrapeResult(target, 1.795e9 + 15 * n, True, 0.01, len(exposition), "", exposition)
            converter.convert(result, Batch())
        if n:
            cpu += time.process_time() - t0
            samples += targets * len(exposition)
    return cpu, samples


def remote_requests(texts: list[str], targets: int, per_request: int) -> list[list[bytes]]:
    """Per scrape, the bodies Prometheus would send for it: every target's samples, labelled as a
    scrape labels them (job, instance, pod), cut into requests of ``per_request`` samples."""
    import cramjam

    from collector.exposition import parse
    from collector.prompb import WriteRequest

    out = []
    for n, text in enumerate(texts):
        exposition = parse(text, "text/plain; version=0.0.4")
        at = int((1.795e9 + 15 * n) * 1000)
        requests, message, count = [], WriteRequest(), 0
        for i in range(targets):
            extra = {"job": "vllm", "instance": f"10.0.{i // 250}.{i % 250}:8000", "pod": f"vllm-{i}"}
            for (name, labels), value in zip(exposition.series, exposition.values, strict=True):
                ts = message.timeseries.add()
                for key, val in sorted({**labels, **extra, "__name__": name}.items()):
                    ts.labels.add(name=key, value=val)
                ts.samples.add(value=value, timestamp=at)
                count += 1
                if count == per_request:
                    requests.append(bytes(cramjam.snappy.compress_raw(message.SerializeToString())))
                    message, count = WriteRequest(), 0
        if count:
            requests.append(bytes(cramjam.snappy.compress_raw(message.SerializeToString())))
        out.append(requests)
    return out


def remote_path(requests: list[list[bytes]]) -> tuple[float, int]:
    from collector.remote_write import RemoteWriteConverter, decode

    converter = RemoteWriteConverter(prior={})
    cpu = 0.0
    samples = 0
    for n, scrape in enumerate(requests):
        t0 = time.process_time()
        kept = 0
        for raw in scrape:
            _batch, counts = converter.convert(decode(raw, HEADERS))
            kept += counts.samples
        if n:
            cpu += time.process_time() - t0
            samples += kept
    return cpu, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=50, help="engines (default 50)")
    parser.add_argument("--scrapes", type=int, default=6, help="scrapes of each (the first is a warm-up)")
    parser.add_argument("--per-request", type=int, default=2000, help="samples per remote-write request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    texts = bodies(args.scrapes, random.Random(1))
    print(f"building remote-write bodies for {args.targets} targets x {args.scrapes} scrapes ...", flush=True)
    requests = remote_requests(texts, args.targets, args.per_request)
    sizes = [len(r) for scrape in requests for r in scrape]
    rates: dict[str, list[float]] = {"scrape": [], "remote_write": []}
    samples: dict[str, int] = {}
    for round_ in range(args.rounds):
        order: list[tuple[str, Any]] = [
            ("scrape", lambda: scrape_path(texts, args.targets)),
            ("remote_write", lambda: remote_path(requests)),
        ]
        for name, run in order if round_ % 2 == 0 else order[::-1]:
            cpu, n = run()
            rates[name].append(n / cpu)
            samples[name] = n
            print(
                f"round {round_ + 1}: {name:13s} {n:>9,d} samples in {cpu:6.3f} CPU-s = {n / cpu:12,.0f} samples/CPU-s"
            )
    scrape = statistics.median(rates["scrape"])
    remote = statistics.median(rates["remote_write"])
    print(
        f"\nmedian of {args.rounds}: scrape {scrape:,.0f} samples/CPU-s; remote-write {remote:,.0f} samples/CPU-s "
        f"({remote / scrape:.2f}x the scrape path); requests of {args.per_request} samples, "
        f"{statistics.median(sizes) / 1024:.0f} KiB compressed"
    )
    if samples["scrape"] != samples["remote_write"]:
        print(f"note: the paths kept different sample counts: {samples}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "targets": args.targets,
                    "scrapes": args.scrapes,
                    "per_request": args.per_request,
                    "samples": samples,
                    "scrape_samples_per_cpu_s": scrape,
                    "remote_write_samples_per_cpu_s": remote,
                    "ratio": remote / scrape,
                    "rounds": rates,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
