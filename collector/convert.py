"""Scrape results -> rows for ClickHouse: ``samples``, ``series`` and ``scrapes`` columns.

In:  ``ScrapeResult``s from the scraper.
Out: column batches (``dict[column, list]``) for the writer: one ``scrapes`` row per scrape
     (up, duration, samples, error), one ``samples`` row per sample, and a ``series`` row the
     first time a series is seen (and every ``SERIES_REFRESH_S`` after, to keep ``last_seen``).

Labels: the target's ``job``, ``instance`` and its labels (``replica``, ``model``, ...) are added
to every series; an exposed label with the same name is kept as ``exported_<name>``, as
Prometheus does without ``honor_labels``. vLLM metric names that changed between versions are
mapped to the current ones (``RENAMES``); the series keeps the name the engine used in
``original_metric``, and nothing unknown is dropped. When an engine exposes both the old and
the new name (deprecation periods), the old one is skipped so nothing is counted twice; a
series repeated within one exposition keeps its first sample; a sample whose own timestamp is
outside 1970-2262 is dropped and counted (``out_of_bounds``).

Counter deltas: every sample carries ``delta``, the reset-aware increase since the previous
sample of the same series, for cumulative series (counters, histogram buckets, sums and
counts): ``v - prev``, or ``v`` when the value went down (the engine restarted and counts from
zero, as Prometheus' ``increase()`` assumes); 0 for the first sample of a series, for NaN and for
gauges. The rollups add deltas up (migrations/clickhouse/0006_rollups.sql). The previous value
comes from this converter's memory or, after a collector restart, from ``prior`` (the last
values in the store, ``load_prior``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from collector.scrape import ScrapeResult

__all__ = ["RENAMES", "Batch", "SeriesConverter", "canonical_name", "cumulative", "fingerprint", "load_prior"]

# old vLLM family name -> current one (suffixes _total/_bucket/_sum/_count/_created follow)
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate": "vllm:prefix_cache_hit_rate",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")
_RENAME_FULL = {old + sfx: new + sfx for old, new in RENAMES.items() for sfx in _SUFFIXES}
SERIES_REFRESH_S = 600.0
MAX_TS = 9.2e9  # seconds: the end of the range pandas/ClickHouse DateTime64 can hold
_CUMULATIVE_SUFFIXES = (
    ("_total", ("counter",)),
    ("_bucket", ("histogram",)),
    ("_count", ("histogram", "summary")),
    ("_sum", ("histogram", "summary")),
)


def canonical_name(name: str) -> str:
    """The current vLLM name for ``name`` (unchanged when it is not an old name)."""
    return _RENAME_FULL.get(name, name)


def cumulative(name: str, types: Mapping[str, str]) -> bool:
    """Whether sample ``name`` only goes up between resets: a counter, a histogram bucket, or a
    histogram/summary sum or count. ``types`` maps family names to their ``# TYPE``; untyped
    samples count as cumulative when named ``*_total``."""
    typ = types.get(name)
    if typ is not None:
        return typ == "counter"
    for suffix, families in _CUMULATIVE_SUFFIXES:
        if name.endswith(suffix):
            typ = types.get(name[: -len(suffix)])
            return suffix == "_total" if typ is None else typ in families
    return False


def load_prior(client: Any, lookback_s: float = 3600.0) -> dict[int, float]:
    """The last value of every series written in the last ``lookback_s``: the "previous sample"
    for the first delta after a collector restart."""
    rows = client.query(
        "SELECT fingerprint, argMax(value, ts) FROM samples "
        "WHERE ts > now64(3) - toIntervalMillisecond({ms:UInt64}) GROUP BY fingerprint",
        parameters={"ms": int(lookback_s * 1000)},
    ).result_rows
    return {int(fp): float(v) for fp, v in rows}


def fingerprint(metric: str, labels: Mapping[str, str]) -> int:
    """A stable 64-bit id of a series: metric name + sorted labels."""
    h = hashlib.blake2b(digest_size=8)
    h.update(metric.encode())
    for key in sorted(labels):
        h.update(b"\xff")
        h.update(key.encode())
        h.update(b"\xfe")
        h.update(labels[key].encode())
    return int.from_bytes(h.digest(), "big")


@dataclass
class Batch:
    """Columns per table produced from one or more scrapes."""

    tables: dict[str, dict[str, list]] = field(default_factory=dict)

    def columns(self, table: str, names: tuple[str, ...]) -> dict[str, list]:
        cols = self.tables.get(table)
        if cols is None:
            cols = self.tables[table] = {n: [] for n in names}
        return cols


SAMPLE_COLUMNS = ("metric", "fingerprint", "ts", "value", "delta")
SERIES_COLUMNS = ("fingerprint", "metric", "original_metric", "labels", "first_seen", "last_seen")
SCRAPE_COLUMNS = ("ts", "job", "instance", "replica", "up", "duration_seconds", "samples_scraped", "error")


class SeriesConverter:
    """Per-target state: the fingerprint of each parsed series, and which series were written."""

    def __init__(self, prior: Mapping[int, float] | None = None) -> None:
        # id(parsed series ref) -> (ref, metric, fingerprint, labels, cumulative); the ref is kept so ids stay valid
        self._refs: dict[int, tuple[object, str, int, dict[str, str], bool]] = {}
        self._last: dict[int, float] = {}  # cumulative series: fingerprint -> last value
        self._prior = prior or {}
        self._written: set[int] = set()
        self._refreshed = time.time()
        self.renamed: dict[str, str] = {}  # old names seen -> new names (shown to users)
        self.duplicates = 0  # samples skipped: series repeated in one exposition, or old+new name
        self.out_of_bounds = 0  # samples skipped: own timestamp outside 1970-2262

    def _resolve(self, ref: tuple[str, Mapping[str, str]], target_labels: dict[str, str]) -> tuple[str, int, dict[str, str]]:
        name, exposed = ref
        metric = canonical_name(name)
        if metric != name:
            self.renamed[name] = metric
        labels = {}
        for key, value in exposed.items():
            labels[f"exported_{key}" if key in target_labels else key] = value
        labels.update(target_labels)
        return metric, fingerprint(metric, labels), labels

    def convert(self, result: ScrapeResult, batch: Batch) -> None:
        target = result.target
        scrape = batch.columns("scrapes", SCRAPE_COLUMNS)
        scrape["ts"].append(result.timestamp)
        scrape["job"].append(target.job)
        scrape["instance"].append(target.instance)
        scrape["replica"].append(target.replica)
        scrape["up"].append(1 if result.up else 0)
        scrape["duration_seconds"].append(result.duration_s)
        scrape["samples_scraped"].append(result.samples)
        scrape["error"].append(result.error)
        exposition = result.exposition
        if exposition is None:
            return
        target_labels = target.all_labels()
        refs = self._refs
        samples = batch.columns("samples", SAMPLE_COLUMNS)
        metrics, fps, values, stamps = samples["metric"], samples["fingerprint"], samples["value"], samples["ts"]
        deltas, last, prior, types = samples["delta"], self._last, self._prior, exposition.types
        now = time.time()
        if now - self._refreshed > SERIES_REFRESH_S:  # re-write series rows: keeps last_seen fresh
            self._written.clear()
            self._refreshed = now
        written = self._written
        new_series = None
        seen: set[int] = set()
        names = {ref[0] for ref in exposition.series} if self.renamed else None
        scrape_ts = result.timestamp
        for ref, value, ts in zip(exposition.series, exposition.values, exposition.timestamps, strict=True):
            known = refs.get(id(ref))
            if known is None or known[0] is not ref:
                metric, fp, labels = self._resolve(ref, target_labels)
                refs[id(ref)] = known = (ref, metric, fp, labels, cumulative(ref[0], types))
                if metric != ref[0] and names is None:
                    names = {r[0] for r in exposition.series}
            fp = known[2]
            if fp in seen or (known[1] != ref[0] and names is not None and known[1] in names):
                self.duplicates += 1  # repeated series, or an old name next to its new one
                continue
            seen.add(fp)
            if ts is not None and not 0 <= ts < MAX_TS:
                self.out_of_bounds += 1
                continue
            if fp not in written:
                written.add(fp)
                if new_series is None:
                    new_series = batch.columns("series", SERIES_COLUMNS)
                new_series["fingerprint"].append(fp)
                new_series["metric"].append(known[1])
                new_series["original_metric"].append(ref[0])
                new_series["labels"].append(known[3])
                new_series["first_seen"].append(now)
                new_series["last_seen"].append(now)
            delta = 0.0
            if known[4] and value == value:  # cumulative and not NaN
                prev = last.get(fp)
                if prev is None:
                    prev = prior.get(fp)
                if prev is not None:
                    delta = value - prev if value >= prev else value
                last[fp] = value
            metrics.append(known[1])
            fps.append(fp)
            values.append(value)
            deltas.append(delta)
            stamps.append(scrape_ts if ts is None else ts)
        if len(refs) > 4 * max(len(exposition.series), 256):  # parser cache was trimmed
            self._refs = {id(r): refs[id(r)] for r in exposition.series if id(r) in refs}
