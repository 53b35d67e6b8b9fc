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
the new name (deprecation periods), the old one is skipped so nothing is counted twice. The
production-stack router also names its families ``vllm:*``: a ``vllm:`` series without the
engines' ``model_name`` label that carries the router's ``server`` label, or is one of the
router's own families (``STACK_ROUTER_FAMILIES``), is stored as ``production_stack:*``
(``stack_router_name``), so no engine figure counts a router's numbers; a
series repeated within one exposition keeps its first sample; a sample whose own timestamp is
outside 1970-2262 is dropped and counted (``out_of_bounds``).

Counter resets: every sample carries ``reset``. For cumulative series (counters, histogram
buckets, sums and counts) whose value went down since the previous sample of the series (the
engine restarted and counts from zero, as Prometheus' ``increase()`` assumes), it is the
previous value; everywhere else 0 (first samples, NaN, gauges). The increase between two
samples is then ``v_b - v_a + sum(reset after a up to b)``: raw-tier queries use that
(migrations/clickhouse/0006_rollups.sql). Every sample also carries ``increase``, its series'
increase since the previous sample (the value itself after a reset; 0 for a first sample, NaN
and gauges), which the rollups sum per bucket (0011_rollup_increases.sql). The previous value
comes from this converter's memory or, after a collector restart, from ``prior`` (the last
values in the store, ``load_prior``).

Speed: a target's exposition has the same series in the same order scrape after scrape (the
parser's cache hands back the same series objects). The converter remembers that layout (kept
samples, metric names, fingerprints, which are counters, their last values) and converts a
scrape with the same layout in a few numpy operations, emitting numpy columns; anything else
(new or vanished series, explicit timestamps, the 10-minute series refresh) takes the general
path, which also records the next layout.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collector.scrape import ScrapeResult

__all__ = [
    "RENAMES",
    "STACK_ROUTER_PREFIX",
    "Batch",
    "SeriesConverter",
    "canonical_name",
    "cumulative",
    "fingerprint",
    "load_prior",
    "stack_router_name",
]

# old vLLM family name -> current one (suffixes _total/_bucket/_sum/_count/_created follow)
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate": "vllm:prefix_cache_hit_rate",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")
# the production-stack router's families that only it has (docs/gateways.md): with its `server`
# label they tell its `vllm:` series from an engine's, which always carry `model_name`
STACK_ROUTER_FAMILIES = frozenset(
    {
        "vllm:current_qps",
        "vllm:avg_decoding_length",
        "vllm:num_prefill_requests",
        "vllm:num_decoding_requests",
        "vllm:num_incoming_requests",
        "vllm:healthy_pods_total",
        "vllm:avg_latency",
        "vllm:avg_itl",
        "vllm:input_tokens",
        "vllm:output_tokens",
        "vllm:request_errors",
        "vllm:request_latency_seconds",
    }
)
STACK_ROUTER_PREFIX = "production_stack:"
_RENAME_FULL = {old + sfx: new + sfx for old, new in RENAMES.items() for sfx in _SUFFIXES}
SERIES_REFRESH_S = 600.0
MAX_TS = 9.2e9  # seconds: the end of the range pandas/ClickHouse DateTime64 can hold
_CUMULATIVE_SUFFIXES = (
    ("_total", ("counter",)),
    ("_bucket", ("histogram",)),
    ("_count", ("histogram", "summary")),
    ("_sum", ("histogram", "summary")),
)


def stack_router_name(name: str, labels: Mapping[str, str]) -> str | None:
    """``production_stack:<name>`` for a production-stack router's ``vllm:`` sample, else None."""
    if not name.startswith("vllm:") or "model_name" in labels:
        return None
    family = name
    for suffix in _SUFFIXES[1:]:
        if name.endswith(suffix) and name[: -len(suffix)] in STACK_ROUTER_FAMILIES:
            family = name[: -len(suffix)]
            break
    if "server" in labels or family in STACK_ROUTER_FAMILIES:
        return STACK_ROUTER_PREFIX + name[len("vllm:") :]
    return None


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
    for the first reset check after a collector restart."""
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
    """Columns per table produced from one or more scrapes (lists, or numpy arrays from the
    converter's fast path)."""

    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def columns(self, table: str, names: tuple[str, ...]) -> dict[str, list[Any]]:
        """The table's columns as lists, to append to."""
        cols = self.tables.get(table)
        if cols is None:
            cols = self.tables[table] = {n: [] for n in names}
        elif not isinstance(cols[names[0]], list):
            for name in names:
                cols[name] = cols[name].tolist()
        return cols

    def extend(self, table: str, arrays: dict[str, np.ndarray]) -> None:
        """Add numpy columns (kept as arrays when the table is empty in this batch)."""
        cols = self.tables.get(table)
        if cols is None:
            self.tables[table] = arrays
            return
        for name, values in arrays.items():
            have = cols[name]
            cols[name] = have + values.tolist() if isinstance(have, list) else np.concatenate([have, values])


@dataclass
class _Layout:
    """What a scrape with the same series as the last one converts to."""

    series: list[Any]  # the exposition's series objects, in order
    keep: np.ndarray | None  # indices of the samples written (None: all of them)
    metric: np.ndarray  # object: metric name per written sample
    fingerprint: np.ndarray  # uint64
    cumulative: np.ndarray  # bool
    last: np.ndarray  # float64: last value of each cumulative series (NaN: none yet)
    skipped: int = 0  # duplicate samples left out per scrape


SAMPLE_COLUMNS = ("metric", "fingerprint", "ts", "value", "reset", "increase")
SERIES_COLUMNS = ("fingerprint", "metric", "original_metric", "labels", "first_seen", "last_seen")
SCRAPE_COLUMNS = ("ts", "job", "instance", "replica", "up", "duration_seconds", "samples_scraped", "error")


class SeriesConverter:
    """Per-target state: the fingerprint of each parsed series, and which series were written."""

    def __init__(self, prior: Mapping[int, float] | None = None) -> None:
        # id(parsed series ref) -> (ref, metric, fingerprint, labels, cumulative); the ref is kept so ids stay valid
        self._refs: dict[int, tuple[object, str, int, dict[str, str], bool]] = {}
        self._last: dict[int, float] = {}  # cumulative series: fingerprint -> last value
        self._layout: _Layout | None = None
        self._prior = prior or {}
        self._written: set[int] = set()
        self._refreshed = time.time()
        self.renamed: dict[str, str] = {}  # old names seen -> new names (shown to users)
        self.duplicates = 0  # samples skipped: series repeated in one exposition, or old+new name
        self.out_of_bounds = 0  # samples skipped: own timestamp outside 1970-2262

    def _resolve(
        self, ref: tuple[str, Mapping[str, str]], target_labels: dict[str, str]
    ) -> tuple[str, int, dict[str, str]]:
        name, exposed = ref
        metric = stack_router_name(name, exposed) or canonical_name(name)
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
        now = time.time()
        layout = self._layout
        if (
            layout is not None
            and now - self._refreshed <= SERIES_REFRESH_S
            and exposition.series == layout.series  # the same objects: compared by identity
            and exposition.timestamps.count(None) == len(exposition.timestamps)
        ):
            self._convert_same_layout(layout, exposition.values, result.timestamp, batch)
            return
        if layout is not None:  # leaving the fast path: its last values go back to the dict
            self._layout = None
            for fp, value, cum in zip(
                layout.fingerprint.tolist(), layout.last.tolist(), layout.cumulative.tolist(), strict=True
            ):
                if cum and value == value:  # noqa: PLR0124 - not NaN
                    self._last[fp] = value
        self._convert_general(result, exposition, now, batch)

    def _convert_same_layout(self, layout: _Layout, raw: list[float], ts: float, batch: Batch) -> None:
        values = np.array(raw, dtype=np.float64)
        if layout.keep is not None:
            values = values[layout.keep]
            self.duplicates += layout.skipped
        prev = layout.last
        counted = layout.cumulative & ~np.isnan(values)
        reset = np.where(counted & (values < prev), prev, 0.0)  # NaN prev: no comparison holds
        # since the previous sample: the difference, or after a reset the value (from zero); 0
        # without a previous one
        increase = np.where(counted & ~np.isnan(prev), np.where(values < prev, values, values - prev), 0.0)
        layout.last = np.where(counted, values, prev)
        batch.extend(
            "samples",
            {
                "metric": layout.metric,
                "fingerprint": layout.fingerprint,
                "ts": np.full(len(values), ts),
                "value": values,
                "reset": reset,
                "increase": increase,
            },
        )

    def _convert_general(self, result: ScrapeResult, exposition: Any, now: float, batch: Batch) -> None:
        target = result.target
        target_labels = target.all_labels()
        refs = self._refs
        samples = batch.columns("samples", SAMPLE_COLUMNS)
        metrics, fps, values, stamps = samples["metric"], samples["fingerprint"], samples["value"], samples["ts"]
        resets, last, prior, types = samples["reset"], self._last, self._prior, exposition.types
        increases = samples["increase"]
        first_row = len(metrics)
        kept: list[int] = []
        layout_ok = True  # no explicit timestamps: later scrapes with these series take the fast path
        if now - self._refreshed > SERIES_REFRESH_S:  # re-write series rows: keeps last_seen fresh
            self._written.clear()
            self._refreshed = now
        written = self._written
        new_series = None
        seen: set[int] = set()
        names = {ref[0] for ref in exposition.series} if self.renamed else None
        scrape_ts = result.timestamp
        for index, (ref, value, ts) in enumerate(
            zip(exposition.series, exposition.values, exposition.timestamps, strict=True)
        ):
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
            if ts is not None:
                layout_ok = False
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
            reset = increase = 0.0
            if known[4] and not math.isnan(value):  # cumulative and a number
                prev = last.get(fp)
                if prev is None:
                    prev = prior.get(fp)
                if prev is not None:  # a drop is a reset: the counter counts from zero again
                    reset, increase = (prev, value) if value < prev else (0.0, value - prev)
                last[fp] = value
            metrics.append(known[1])
            fps.append(fp)
            values.append(value)
            resets.append(reset)
            increases.append(increase)
            stamps.append(scrape_ts if ts is None else ts)
            kept.append(index)
        if len(refs) > 4 * max(len(exposition.series), 256):  # parser cache was trimmed
            self._refs = {id(r): refs[id(r)] for r in exposition.series if id(r) in refs}
        if layout_ok:
            self._keep_layout(exposition, kept, metrics[first_row:], fps[first_row:])

    def _keep_layout(self, exposition: Any, kept: list[int], metrics: list[str], fps: list[int]) -> None:
        """The layout of a scrape without explicit timestamps (its ``kept`` series, their metrics and
        fingerprints), for the fast path of the next scrapes with the same series."""
        last, prior = self._last, self._prior
        cumulative_kept = np.array([self._refs[id(exposition.series[i])][4] for i in kept], dtype=bool)
        self._layout = _Layout(
            series=list(exposition.series),
            keep=None if len(kept) == len(exposition.series) else np.array(kept, dtype=np.intp),
            metric=np.array(metrics, dtype=object),
            fingerprint=np.array(fps, dtype=np.uint64),
            cumulative=cumulative_kept,
            last=np.array(
                [
                    last.get(fp, prior.get(fp, np.nan)) if c else np.nan
                    for fp, c in zip(fps, cumulative_kept.tolist(), strict=True)
                ]
            ),
            skipped=len(exposition.series) - len(kept),
        )
