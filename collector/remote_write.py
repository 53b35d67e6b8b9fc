"""Prometheus remote-write 1.0 in: request bodies -> the rows a scrape makes (``samples``, ``series``, ``scrapes``).

In:  ``POST /api/v1/write`` bodies from Prometheus, vmagent, Grafana Agent/Alloy, OpenTelemetry's
     Prometheus exporter ...: raw (unframed) snappy of a ``prometheus.WriteRequest``
     (``Content-Encoding: snappy``, ``X-Prometheus-Remote-Write-Version: 0.1.0``).
Out: a ``Batch`` of the same columns ``collector.convert`` makes from a scrape, and what became
     of the samples (``WriteCounts``). A body that will never be good raises
     ``RemoteWriteError`` with a 4xx status and the reason, before anything is kept: the sender
     drops it. (The receiver answers 5xx when the store cannot take rows now: the sender retries.)

Series are stored as a scrape stores them: the labels but ``__name__``, the metric name mapped
as a scrape maps it (vLLM's old names, the production-stack router's ``vllm:`` families), and a
``replica`` label when the series has none: the first of ``replica_labels`` it carries (``pod``,
``instance`` ...), so the sender's service discovery names the replicas. Prometheus's per-target
series (``up``, ``scrape_duration_seconds``, ``scrape_samples_scraped`` ...) become ``scrapes``
rows instead, as a scrape's own outcome does.

Counters: a series is cumulative by the sender's metadata (``MetricMetadata``, sent every minute
by Prometheus) or, before any, by its name (``_total``, a ``_bucket`` with ``le``, ``_sum``,
``_count``). ``reset`` and ``increase`` are computed as for a scrape, per series in time order
from the previous sample this receiver kept (or ``prior``: the store's last values after a
restart). A sample not newer than the series' last one (a batch sent again after a timeout)
is dropped, so no increase is counted twice. Prometheus's staleness markers are dropped.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cramjam
from google.protobuf.message import DecodeError

from collector.convert import (
    MAX_TS,
    SAMPLE_COLUMNS,
    SCRAPE_COLUMNS,
    SERIES_COLUMNS,
    SERIES_REFRESH_S,
    Batch,
    canonical_name,
    cumulative,
    fingerprint,
    stack_router_name,
)
from collector.errors import CollectorError
from collector.prompb import Label, RawWriteRequest, metric_types

__all__ = [
    "REPLICA_LABELS",
    "RemoteWriteConfig",
    "RemoteWriteConverter",
    "RemoteWriteError",
    "WriteCounts",
    "check_headers",
    "decode",
]

REPLICA_LABELS = ("replica", "pod", "instance")
MAX_DECODED_BYTES = 64 * 1024 * 1024
STALE_NAN = 0x7FF0000000000002  # Prometheus's staleness marker: a NaN with this bit pattern
# a target's series Prometheus and vmagent add to every scrape: they make the `scrapes` row
SCRAPE_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "scrape_timeout_seconds",
        "scrape_sample_limit",
        "scrape_body_size_bytes",
        "scrape_response_size_bytes",
    }
)
_PRUNE_S = 3600.0  # a series not sent for this long is forgotten, all but its last value
_FORGOTTEN_MAX = 1_000_000  # last values of forgotten series kept (about 100 MB at most)
_REASON_MAX = 400  # characters of a refusal's reason (a label may be megabytes)
_to_bits = struct.Struct("<d")


class RemoteWriteError(CollectorError, ValueError):
    """A body the receiver refuses: ``status`` is the HTTP answer (4xx: the sender drops it)."""

    def __init__(self, status: int, reason: str) -> None:
        if len(reason) > _REASON_MAX:
            reason = reason[:_REASON_MAX] + f"... ({len(reason)} characters)"
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RemoteWriteConfig:
    replica_labels: tuple[str, ...] = REPLICA_LABELS  # the first one a series carries names its replica
    max_decoded_bytes: int = MAX_DECODED_BYTES


@dataclass
class WriteCounts:
    """What became of one request's samples."""

    series: int = 0
    samples: int = 0  # kept as samples
    scrapes: int = 0  # `up` samples kept as scrapes rows
    stale: int = 0  # staleness markers, dropped
    duplicate: int = 0  # not newer than the series' last sample, dropped
    out_of_bounds: int = 0  # timestamps outside 1970-2262, dropped
    histograms: int = 0  # native histogram samples, not stored (classic histograms are)
    metadata: int = 0
    newest: dict[str, float] = field(default_factory=dict)  # job -> its newest sample time in the request

    def dropped(self) -> dict[str, int]:
        return {
            "stale": self.stale,
            "duplicate": self.duplicate,
            "out_of_bounds": self.out_of_bounds,
            "native_histogram": self.histograms,
        }


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse (415) what is not remote-write 1.0 by its headers alone, before the body is read
    (an HTTP server would otherwise inflate a gzip body first, and fail on a bad one)."""
    content_type = headers.get("Content-Type", "")
    if "io.prometheus.write.v2" in content_type:
        raise RemoteWriteError(
            415, "remote-write 2.0 is not supported: send 1.0 (protobuf_message: prometheus.WriteRequest)"
        )
    encoding = headers.get("Content-Encoding", "snappy").strip().lower()
    if encoding != "snappy":
        raise RemoteWriteError(415, f"Content-Encoding {encoding!r}: remote-write bodies are snappy-compressed")


def decode(body: bytes, headers: Mapping[str, str], max_decoded_bytes: int = MAX_DECODED_BYTES) -> Any:
    """A remote-write body -> ``RawWriteRequest``; ``RemoteWriteError`` (4xx) with the reason otherwise."""
    check_headers(headers)
    if not body:
        raise RemoteWriteError(400, "empty body: expected snappy-compressed prometheus.WriteRequest")
    try:
        size = cramjam.snappy.decompress_raw_len(body)
    except Exception as exc:  # noqa: BLE001 - cramjam raises its own DecompressionError or ValueError
        raise RemoteWriteError(400, f"not snappy-compressed (raw block format): {exc}") from None
    if size > max_decoded_bytes:
        raise RemoteWriteError(413, f"body decodes to {size} bytes, over the limit of {max_decoded_bytes}")
    try:
        data = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # noqa: BLE001
        raise RemoteWriteError(400, f"not snappy-compressed (raw block format): {exc}") from None
    try:
        return RawWriteRequest.FromString(data)
    except (DecodeError, RecursionError) as exc:
        raise RemoteWriteError(400, f"not a protobuf prometheus.WriteRequest: {exc}") from None


@dataclass
class _Series:
    """A series the receiver has seen, by its encoded labels."""

    name: str  # as sent
    metric: str  # as stored
    fingerprint: int
    labels: dict[str, str]
    scrape: bool  # one of SCRAPE_SERIES: feeds `scrapes` rows
    job: str
    cumulative: bool = False
    last_ts: float = -math.inf
    last: float | None = None  # last kept value (cumulative series)
    written: float = -math.inf  # when its `series` row was last written
    seen: float = field(default_factory=time.time)
    alias: bool = False  # an old vLLM name beside its new one: its samples are the new one's, dropped


class RemoteWriteConverter:
    """Per-series state across requests (last sample, last value), like ``SeriesConverter``'s per target."""

    def __init__(self, config: RemoteWriteConfig | None = None, prior: Mapping[int, float] | None = None) -> None:
        self.config = config or RemoteWriteConfig()
        self._prior = prior or {}  # the store's last values at start (shared with the scrape path: not changed)
        self._forgotten: dict[int, tuple[float, float | None]] = {}  # pruned series: fingerprint -> (last ts, last)
        self._series: dict[tuple[bytes, ...], _Series] = {}
        self._owners: dict[int, tuple[bytes, ...]] = {}  # fingerprint -> the key whose samples count
        self._types: dict[str, str] = {}  # family -> type, from the senders' metadata
        self._pruned = time.time()
        self.renamed: dict[str, str] = {}

    def convert(self, message: Any) -> tuple[Batch, WriteCounts]:
        """One decoded request -> rows. Every series is checked before any state changes: a
        request with a bad series raises ``RemoteWriteError`` (400) and keeps nothing."""
        counts = WriteCounts(series=len(message.timeseries), metadata=len(message.metadata))
        known, new = self._series.get, dict[tuple[bytes, ...], _Series]()
        resolved = []
        for number, key in enumerate((tuple(ts.labels) for ts in message.timeseries), 1):
            series = known(key) or new.get(key)
            if series is None:
                series = new[key] = self._resolve(key, number)
            resolved.append(series)
        # every series passed: now (not before) the request may change what the converter knows
        for key, series in new.items():
            self._adopt(key, series)
        if message.metadata:
            self._learn_types(metric_types(message))
        now = time.time()
        batch = Batch()
        samples = batch.columns("samples", SAMPLE_COLUMNS)
        meta: dict[tuple[str, str, float], dict[str, Any]] = {}
        for ts, series in zip(message.timeseries, resolved, strict=True):
            counts.histograms += len(ts.histograms)
            series.seen = now
            for sample in ts.samples:
                self._sample(series, sample.value, sample.timestamp / 1000.0, samples, meta, counts)
            if series.last_ts > counts.newest.get(series.job, -math.inf):
                counts.newest[series.job] = series.last_ts
            stale_row = series.written < now - SERIES_REFRESH_S and series.last_ts > -math.inf
            if stale_row and not (series.scrape or series.alias):
                series.written = now
                self._series_row(batch, series, now)
        self._scrape_rows(batch, meta, counts)
        if now - self._pruned > _PRUNE_S / 6:
            self._prune(now)
        return batch, counts

    # ------------------------------------------------------------------ series
    def _resolve(self, key: tuple[bytes, ...], number: int) -> _Series:
        """A series first seen: its labels decoded and checked, its name and fingerprint."""
        labels: dict[str, str] = {}
        for raw in key:
            try:
                label = Label.FromString(raw)
            except DecodeError as exc:
                raise RemoteWriteError(400, f"series {number}: a label is not a protobuf Label: {exc}") from None
            if not label.name:
                raise RemoteWriteError(400, f"series {number}: a label without a name")
            if label.name in labels:
                raise RemoteWriteError(400, f"series {number}: label {label.name!r} twice")
            labels[label.name] = label.value
        name = labels.pop("__name__", "")
        if not name:
            raise RemoteWriteError(400, f"series {number}: no __name__ label (labels: {_shown(labels)})")
        if "replica" not in labels:
            replica = next((labels[k] for k in self.config.replica_labels if labels.get(k)), "")
            if replica:
                labels["replica"] = replica
        metric = stack_router_name(name, labels) or canonical_name(name)
        series = _Series(
            name, metric, fingerprint(metric, labels), labels, name in SCRAPE_SERIES, labels.get("job", "")
        )
        series.cumulative = self._cumulative(name, labels)
        return series

    def _adopt(self, key: tuple[bytes, ...], series: _Series) -> None:
        """Keep a new series. Its previous value: its own before it was forgotten, else the store's.
        When an engine exposes a vLLM name and its old name (a deprecation period), both map to one
        fingerprint: the new name's samples count, the old one's are dropped, as a scrape does."""
        fp = series.fingerprint
        if series.metric != series.name:
            self.renamed[series.name] = series.metric
        last_ts, last = self._forgotten.pop(fp, (-math.inf, self._prior.get(fp)))
        series.last_ts, series.last = last_ts, last if series.cumulative else None
        owner = self._series.get(self._owners.get(fp, ()))
        if owner is not None and owner is not series:
            if series.name != series.metric:  # this is the old name
                series.alias = True
            else:  # the new name takes over, where the old one was
                owner.alias = True
                series.last_ts, series.last = owner.last_ts, owner.last
                self._owners[fp] = key
        else:
            self._owners[fp] = key
        self._series[key] = series

    def _cumulative(self, name: str, labels: Mapping[str, str]) -> bool:
        if name in self._types or any(name.endswith(s) and name[: -len(s)] in self._types for s in _SUFFIXES):
            return cumulative(name, self._types)
        if name.endswith("_bucket"):
            return "le" in labels
        return name.endswith(("_total", "_sum", "_count"))

    def _learn_types(self, types: dict[str, str]) -> None:
        changed = {k: v for k, v in types.items() if self._types.get(k) != v}
        if not changed:
            return
        self._types.update(changed)
        for series in self._series.values():  # metadata may come after a series' first samples
            series.cumulative = self._cumulative(series.name, series.labels)

    def _prune(self, now: float) -> None:
        """Forget series not sent for an hour; keep their last values, so a series that comes back
        counts its increase from where it was (as a scrape's converter, which forgets nothing)."""
        self._pruned = now
        kept = {}
        for key, series in self._series.items():
            if now - series.seen < _PRUNE_S:
                kept[key] = series
            elif not series.alias:
                self._forgotten[series.fingerprint] = (series.last_ts, series.last)
                if len(self._forgotten) > _FORGOTTEN_MAX:  # the oldest first
                    del self._forgotten[next(iter(self._forgotten))]
                if self._owners.get(series.fingerprint) == key:
                    del self._owners[series.fingerprint]
        self._series = kept

    # ------------------------------------------------------------------ samples
    def _sample(
        self,
        series: _Series,
        value: float,
        ts: float,
        samples: dict[str, list[Any]],
        meta: dict[tuple[str, str, float], dict[str, Any]],
        counts: WriteCounts,
    ) -> None:
        if series.alias:  # an old name beside its new one: the new one's samples count
            counts.duplicate += 1
            return
        if value != value and _to_bits.pack(value) == _to_bits.pack(_STALE):  # noqa: PLR0124 - NaN check
            counts.stale += 1
            return
        if not 0 <= ts < MAX_TS:
            counts.out_of_bounds += 1
            return
        if ts <= series.last_ts:
            counts.duplicate += 1
            return
        series.last_ts = ts
        if series.scrape:
            labels = series.labels
            key = (labels.get("job", ""), labels.get("instance", ""), ts)
            meta.setdefault(key, {"replica": labels.get("replica", "")})[series.name] = value
            return
        reset = increase = 0.0
        if series.cumulative and value == value:  # noqa: PLR0124 - not NaN
            prev = series.last
            if prev is not None:  # a drop is a reset: the counter counts from zero again
                reset, increase = (prev, value) if value < prev else (0.0, value - prev)
            series.last = value
        samples["metric"].append(series.metric)
        samples["fingerprint"].append(series.fingerprint)
        samples["ts"].append(ts)
        samples["value"].append(value)
        samples["reset"].append(reset)
        samples["increase"].append(increase)
        counts.samples += 1

    @staticmethod
    def _series_row(batch: Batch, series: _Series, now: float) -> None:
        rows = batch.columns("series", SERIES_COLUMNS)
        rows["fingerprint"].append(series.fingerprint)
        rows["metric"].append(series.metric)
        rows["original_metric"].append(series.name)
        rows["labels"].append(series.labels)
        rows["first_seen"].append(now)
        rows["last_seen"].append(now)

    @staticmethod
    def _scrape_rows(batch: Batch, meta: dict[tuple[str, str, float], dict[str, Any]], counts: WriteCounts) -> None:
        """Prometheus's per-scrape series -> one ``scrapes`` row per target and time (with an ``up``)."""
        for (job, instance, ts), values in meta.items():
            up = values.get("up")
            if up is None or up != up:  # noqa: PLR0124 - NaN
                continue
            rows = batch.columns("scrapes", SCRAPE_COLUMNS)
            rows["ts"].append(ts)
            rows["job"].append(job)
            rows["instance"].append(instance)
            rows["replica"].append(values["replica"])
            rows["up"].append(1 if up >= 1 else 0)
            rows["duration_seconds"].append(_number(values.get("scrape_duration_seconds")))
            rows["samples_scraped"].append(int(_number(values.get("scrape_samples_scraped"))))
            rows["error"].append("" if up >= 1 else "down (as the remote-write sender scraped it)")
            counts.scrapes += 1


_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_STALE = _to_bits.unpack(struct.pack("<Q", STALE_NAN))[0]


def _number(value: float | None) -> float:
    return 0.0 if value is None or value != value else value  # noqa: PLR0124 - NaN


def _shown(labels: Mapping[str, str]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in list(labels.items())[:8])
    return text or "none"
