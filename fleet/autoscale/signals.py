"""A pool's LLM signals, live: its ready replicas' ``/metrics`` -> the policy's signal values.

In:  the URLs of a pool's ready replicas (vLLM's or the simulator's Prometheus exposition) and
     the model's TTFT target (``models.<m>.slo.ttft`` of the fleet spec; none: no TTFT signal).
Out: ``PoolReader.read`` -> ``{signal: value}`` for ``policy.decide``: the mean per replica of
     ``kv_cache_usage`` (``vllm:kv_cache_usage_perc``, 0-1), ``requests_waiting`` and
     ``requests_running``, and ``ttft_p99_over_slo``: the p99 of the TTFT histogram's increase
     since the previous read (summed over the replicas, interpolated in its bucket), over the
     target. A replica that does not answer is left out of the means (said in ``errors``); with
     none answering the result is empty and the policy holds. Parsed with prometheus_client's parser.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["PoolReader", "Scrape", "p99_of_increase", "parse_metrics"]

KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the newer name first
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
TTFT = "vllm:time_to_first_token_seconds"


@dataclass
class Scrape:
    """One replica's gauges and its cumulative TTFT histogram (upper bound -> count)."""

    gauges: dict[str, float] = field(default_factory=dict)
    ttft: dict[float, float] = field(default_factory=dict)


def parse_metrics(text: str) -> Scrape:
    """The gauges the policy reads and the TTFT buckets, summed over label sets (model, engine)."""
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (*KV, WAITING, RUNNING):
                out.gauges[sample.name] = out.gauges.get(sample.name, 0.0) + sample.value
            elif sample.name == f"{TTFT}_bucket":
                bound = float(sample.labels["le"])
                out.ttft[bound] = out.ttft.get(bound, 0.0) + sample.value
    return out


def p99_of_increase(before: dict[float, float], after: dict[float, float], q: float = 0.99) -> float | None:
    """The q-quantile of the observations between two cumulative histograms (linear in the
    bucket, as Prometheus' histogram_quantile); None with no observation. A counter that went
    down (an engine restarted) counts from zero."""
    bounds = sorted(after)
    if not bounds:
        return None
    reset = any(after[b] < before.get(b, 0.0) for b in bounds)
    counts = [after[b] - (0.0 if reset else before.get(b, 0.0)) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bucket: its bound, as Prometheus does
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


class PoolReader:
    """Reads one pool's signals; keeps each replica's last TTFT histogram for the next delta."""

    def __init__(self, ttft_slo_s: float | None, timeout_s: float = 3.0) -> None:
        self.ttft_slo_s = ttft_slo_s
        self.timeout_s = timeout_s
        self._last: dict[str, dict[float, float]] = {}
        self.errors: list[str] = []

    async def read(self, client: httpx.AsyncClient, replicas: dict[str, str]) -> dict[str, float]:
        """``replicas``: name -> base URL (ready replicas only), read at once."""
        self.errors = []
        scrapes: dict[str, Scrape] = {}

        async def one(name: str, url: str) -> None:
            try:
                response = await client.get(f"{url}/metrics", timeout=self.timeout_s)
                response.raise_for_status()
                scrapes[name] = parse_metrics(response.text)
            except (httpx.HTTPError, ValueError) as exc:
                self.errors.append(f"{name}: /metrics: {exc}")

        await asyncio.gather(*(one(n, u) for n, u in replicas.items()))
        for gone in set(self._last) - set(replicas):
            del self._last[gone]
        return self.combine(scrapes)

    def combine(self, scrapes: dict[str, Scrape]) -> dict[str, float]:
        if not scrapes:
            return {}
        n = len(scrapes)

        def mean(*names: str) -> float:
            return sum(next((s.gauges[m] for m in names if m in s.gauges), 0.0) for s in scrapes.values()) / n

        signals = {
            "kv_cache_usage": mean(*KV),
            "requests_waiting": mean(WAITING),
            "requests_running": mean(RUNNING),
        }
        increase: dict[float, float] = {}
        for name, scrape in scrapes.items():
            last = self._last.get(name)
            if last is not None:  # a replica's first read is its baseline
                reset = any(v < last.get(b, 0.0) for b, v in scrape.ttft.items())  # restarted: from zero
                for bound, value in scrape.ttft.items():
                    increase[bound] = increase.get(bound, 0.0) + value - (0.0 if reset else last.get(bound, 0.0))
            self._last[name] = scrape.ttft
        p99 = p99_of_increase({}, increase)
        if p99 is not None and self.ttft_slo_s:
            signals["ttft_p99_over_slo"] = p99 / self.ttft_slo_s
        return signals
