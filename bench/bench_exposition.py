"""Benchmark: our exposition parser vs prometheus_client's, on the same real vLLM /metrics.

The exposition is a capture of a vLLM 0.32 (CPU build) engine of the bundled fleet
(bench/data/vllm-0.32-cpu-metrics.txt, 432 samples); --file takes another one. Both parsers
run side by side in one process, best of several rounds each:

- prometheus_client.parser.text_string_to_metric_families (the reference), fully consumed;
- ours, cold: a fresh parse of every series (no cache) -> Sample tuples;
- ours, warm: a scrape of a target seen before (its SeriesCache, as the collector keeps one
  per target, like Prometheus' scrape cache) -> columnar result the collector consumes;
- ours, warm + Sample tuples: the same, also materialising Sample(name, labels, value, ts).

Prints samples/s for each and the ratio to the reference. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from collector.exposition import SeriesCache, parse

DEFAULT = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"


def per_call(fn, seconds: float) -> float:
    """Mean time per call over about ``seconds``."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return elapsed / n


def best_interleaved(variants, seconds: float, rounds: int = 5) -> list[float]:
    """Best time per call of each variant; rounds interleave the variants, so a burst of load
    from elsewhere on the machine hits all of them alike instead of skewing one ratio."""
    best = [float("inf")] * len(variants)
    for _ in range(rounds):
        for i, (_name, fn) in enumerate(variants):
            best[i] = min(best[i], per_call(fn, seconds / rounds))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEFAULT)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per variant")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    text = args.file.read_text()

    def reference() -> int:
        return sum(len(f.samples) for f in text_string_to_metric_families(text))

    n = reference()
    assert n == len(parse(text)), "parsers disagree on the sample count"
    cache = SeriesCache()
    parse(text, cache=cache)
    variants = [
        ("prometheus_client (reference)", reference),
        ("ours, cold (no cache), Sample tuples", lambda: parse(text).samples),
        ("ours, warm (per-target cache), columnar", lambda: parse(text, cache=cache)),
        ("ours, warm, Sample tuples", lambda: parse(text, cache=cache).samples),
    ]
    print(f"exposition: {args.file.name}, {n} samples, {len(text):,} bytes")
    times = best_interleaved(variants, args.seconds)
    for (name, _fn), t in zip(variants, times, strict=True):
        print(f"{name:<42} {n / t:>12,.0f} samples/s   {times[0] / t:6.1f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "samples": n,
                    "variants": {
                        name: {"samples_per_s": n / t, "ratio": times[0] / t}
                        for (name, _fn), t in zip(variants, times, strict=True)
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
