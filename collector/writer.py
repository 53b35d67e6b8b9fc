"""Writer: column batches -> ClickHouse inserts, batched, retried, spooled to disk, deduplicated.

In:  ``add(table, columns)`` calls from the collector (any thread); ``add_raw(table, body, rows,
     fmt, settings)`` for bodies ClickHouse parses itself (OTLP exports in ``FORMAT Protobuf``:
     ``collector.otlp_native``), concatenated per table like columns are.
Out: ``insert_df`` (columns) and ``raw_insert`` (bodies) calls on a clickhouse-connect client, at
     most about one per table per ``flush_interval_s`` or when ``batch_rows`` are waiting
     (``samples`` into ``samples_ingest``, ``INSERT_INTO``: its views store and roll them up).

Nothing is lost when ClickHouse is away, and nothing is counted twice:
- every batch gets a deduplication token and is written to the spool directory (a
  write-ahead file) *before* it is inserted; the file is removed only after the insert
  succeeded. One file holds the batches of every table cut at the same time, and
  ``add_tables`` queues one scrape's rows for all tables at once, so a crash keeps a scrape's
  samples and its ``scrapes`` row together or loses both (a lost interval, never half of one). A crash between
  insert and removal replays the batch on restart, and the
  tables' ``non_replicated_deduplication_window`` (replicated tables dedupe by default)
  drops the repeat because the token is the same.
- while an insert fails, batches stay in the spool and are replayed oldest first, with
  exponential backoff, when the store answers again; newer batches queue behind them, so
  order is kept.
- memory is bounded (a table's buffer that reaches twice ``max_buffer_rows`` while the writer
  thread is held up, e.g. by a hanging insert, is cut and spooled by the caller); the spool
  is bounded (``spool_max_bytes``): past it new batches are dropped and counted
  (``fleetscope_collector_dropped_rows_total``) and an error is logged.
- a batch the store keeps refusing while it answers ``SELECT 1`` (bad data, not an outage)
  is moved to ``spool/rejected/`` after ``max_attempts`` tries of that batch so it cannot
  block the rest; errors that mean "try later" (too many parts, memory, read-only replica,
  timeouts, Keeper) never reject, and a failed ping means an outage, which resets the count.
  A batch that cannot even be turned into a frame (e.g. a timestamp out of range) is
  rejected at once.
- buffers are cut into the spool every ``flush_interval_s`` even while inserts back off, so a
  crash during an outage loses at most one interval of rows.
Spool files (``collector.spool``) are written and read only by this process's user: a short
header, a pickle of the batches, then the large buffers (raw bodies, numpy columns) as they are,
out of the pickle (protocol 5), so spooling copies them once (to the file) and replaying reads
them once. A raw batch's bodies are never joined in memory: the spool file and the insert (the
embedded store's input file, or a server's HTTP body) take them piece by piece. A file the
writer has just spooled is inserted from memory (``FRESH_MAX_BYTES``), not read back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from collector.config import BATCH_ROWS, FLUSH_INTERVAL_S, SPOOL_MAX_BYTES
from collector.spool import FRESH_MAX_BYTES, Raw, chunks, combine, pieces, read_spool_file, write_atomic
from collector.spool import rows as rows_of
from collector.spool import size as size_of

__all__ = ["Raw", "Writer", "WriterConfig", "TIME_COLUMNS", "read_spool_file"]

log = logging.getLogger("fleetscope.writer")

# columns holding epoch seconds that ClickHouse stores as DateTime / DateTime64
TIME_COLUMNS = {"ts", "first_seen", "last_seen"}
# a batch's table -> the table inserted into: samples go through the Null table whose views store
# them (without their increase) and roll them up (migration 0016)
INSERT_INTO = {"samples": "samples_ingest"}


@dataclass(frozen=True)
class WriterConfig:
    spool_dir: Path
    batch_rows: int = BATCH_ROWS
    flush_interval_s: float = FLUSH_INTERVAL_S
    max_buffer_rows: int = 500_000
    spool_max_bytes: int = SPOOL_MAX_BYTES
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    max_attempts: int = 5


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Counter(
            "fleetscope_collector_inserted_rows_total", "Rows inserted into ClickHouse", ["table"], registry=registry
        )
        self.batches = Counter(
            "fleetscope_collector_insert_batches_total", "Insert batches", ["table", "result"], registry=registry
        )
        self.latency = Histogram(
            "fleetscope_collector_insert_seconds",
            "Insert latency",
            ["table"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.spool_bytes = Gauge("fleetscope_collector_spool_bytes", "Bytes waiting in the spool", registry=registry)
        self.spool_batches = Gauge(
            "fleetscope_collector_spool_batches", "Batches waiting in the spool", registry=registry
        )
        self.dropped = Counter(
            "fleetscope_collector_dropped_rows_total", "Rows dropped: spool full", ["table"], registry=registry
        )
        self.lag = Gauge(
            "fleetscope_collector_write_lag_seconds",
            "Age of the oldest row not yet in the store (buffered or spooled); 0 when all are in",
            registry=registry,
        )
        self.rejected = Counter(
            "fleetscope_collector_rejected_rows_total",
            "Rows the store refused (moved to spool/rejected)",
            ["table"],
            registry=registry,
        )


# ClickHouse errors that mean "the store is busy or degraded", never "the data is bad"
_TRANSIENT = (
    "TOO_MANY_PARTS",
    "MEMORY_LIMIT_EXCEEDED",
    "TABLE_IS_READ_ONLY",
    "READONLY",
    "TIMEOUT_EXCEEDED",
    "NETWORK_ERROR",
    "SOCKET_TIMEOUT",
    "KEEPER_EXCEPTION",
    "NO_ZOOKEEPER",
    "ALL_CONNECTION_TRIES_FAILED",
    "TOO_MANY_SIMULTANEOUS_QUERIES",
    "Cannot lock file",
    "Connection",
)


def _frame(columns: dict[str, list[Any]]) -> pd.DataFrame:
    data: dict[str, Any] = {}
    for name, values in columns.items():
        data[name] = pd.to_datetime(values, unit="s", utc=True) if name in TIME_COLUMNS else values
    return pd.DataFrame(data)


class Writer:
    """Thread-safe batching writer with a write-ahead spool. ``start()`` runs its thread."""

    def __init__(
        self,
        client: Any,
        config: WriterConfig,
        registry: CollectorRegistry | None = None,
        ping: Callable[[], bool] | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.metrics = _Metrics(registry or CollectorRegistry())
        self._ping = ping or self._default_ping
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._buffers: dict[str, list[Any]] = {}  # table -> chunks as added
        self._counts: dict[str, int] = {}  # table -> rows buffered
        self._buffer_since: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()  # one flush at a time (thread, close(), tests)
        self._seq = 0
        self._attempts: dict[str, int] = {}  # spool file name -> failed tries while the store answered
        self._fresh: dict[str, tuple[list[dict[str, Any]], int]] = {}  # just spooled: name -> (batches, bytes)
        self._fresh_bytes = 0
        self.spool = config.spool_dir
        self.spool.mkdir(parents=True, exist_ok=True)
        (self.spool / "rejected").mkdir(exist_ok=True)
        for leftover in self.spool.glob("*.tmp"):  # a crash while writing: never inserted, never acknowledged
            leftover.unlink(missing_ok=True)
        existing = self._spooled()
        if existing:
            self._seq = max(int(p.name.split("-", 1)[0]) for p in existing)
            log.info("spool has %d batch(es) from before: replaying them first", len(existing))
        self._update_spool_metrics()
        self._room_checked = (-1.0, True)  # (monotonic time, spool had room)
        self.metrics.lag.set_function(self.lag_s)

    # ------------------------------------------------------------------ intake
    def has_room(self, share: float = 0.9) -> bool:
        """Whether the spool is below ``share`` of ``spool_max_bytes`` (checked at most once a
        second): a receiver whose sender can retry (remote-write) answers 503 when not, so rows
        wait at the sender instead of being dropped here."""
        checked, room = self._room_checked
        now = time.monotonic()
        if now - checked >= 1.0:
            room = self.spool_size()[1] < share * self.config.spool_max_bytes
            self._room_checked = (now, room)
        return room

    def lag_s(self) -> float:
        """Seconds since the oldest row not yet inserted was added (buffers and spool files)."""
        now_mono, now = time.monotonic(), time.time()
        with self._lock:
            oldest = min(self._buffer_since.values(), default=now_mono)
        lag = now_mono - oldest
        for path in self._spooled()[:1]:  # oldest first (sequence-numbered names)
            with contextlib.suppress(FileNotFoundError):  # inserted meanwhile
                lag = max(lag, now - path.stat().st_mtime)
        return max(lag, 0.0)

    def add(self, table: str, columns: dict[str, Any]) -> None:
        """Queue rows for ``table`` (columns as lists or numpy arrays). The writer takes
        ownership of them (no copy): the caller must not change them afterwards."""
        self.add_tables({table: columns})

    def add_raw(
        self, table: str, data: bytes | tuple[bytes, ...], rows: int, fmt: str, settings: dict[str, str] | None = None
    ) -> None:
        """Queue ``rows`` rows for ``table`` as bytes ClickHouse parses (``INSERT ... FORMAT fmt``
        with ``settings``); chunks must be concatenable in that format (e.g. length-delimited
        Protobuf messages). ``data`` may come in pieces (e.g. a length prefix and a body): they
        are joined once, with the batch. A table takes either columns or raw chunks, not both."""
        size = len(data) if isinstance(data, bytes) else sum(len(piece) for piece in data)
        self.add_tables({table: Raw(data, rows, fmt, tuple(sorted((settings or {}).items())), (size,), (rows,))})

    def add_tables(self, tables: dict[str, Any]) -> None:
        """Queue rows for several tables at once: they go to the spool in the same file (e.g. a
        scrape's samples, its series and its scrapes row), so a crash keeps all or none."""
        sizes = {}
        with self._lock:
            for table, columns in tables.items():
                rows = rows_of(columns)
                if not rows:
                    continue
                chunks = self._buffers.get(table)
                if chunks is None:
                    chunks = self._buffers[table] = []
                    self._buffer_since[table] = time.monotonic()
                chunks.append(columns)
                sizes[table] = self._counts[table] = self._counts.get(table, 0) + rows
        if any(size >= self.config.batch_rows for size in sizes.values()):
            self._wake.set()
        if any(size >= 2 * self.config.max_buffer_rows for size in sizes.values()):
            # the writer thread is stuck (e.g. a hanging insert): spool here to bound memory
            try:
                self._cut(*self._due(force=True))
            except OSError as exc:
                log.error("cannot spool %s rows: %s", ", ".join(sizes), exc)

    # ------------------------------------------------------------------ spool
    def _spooled(self) -> list[Path]:
        return sorted(self.spool.glob("*.batch"))

    def spool_size(self) -> tuple[int, int]:
        count = size = 0
        for path in self._spooled():
            try:
                size += path.stat().st_size
                count += 1
            except FileNotFoundError:  # inserted and removed meanwhile
                continue
        return count, size

    def _update_spool_metrics(self) -> None:
        count, size = self.spool_size()
        self.metrics.spool_batches.set(count)
        self.metrics.spool_bytes.set(size)

    def _cut(self, *tables: str) -> None:
        """Take the buffered rows of ``tables`` and write them to the spool as one file, so that
        a crash keeps all of one flush or none of it (a scrape's samples and its scrapes row
        land together)."""
        with self._lock:
            taken = []
            for table in tables:
                chunks = self._buffers.pop(table, None)
                self._buffer_since.pop(table, None)
                self._counts.pop(table, None)
                if chunks:
                    taken.append((table, chunks))
            if not taken:
                return
            self._seq += 1
            seq = self._seq
        batches: list[dict[str, Any]] = [
            {"table": table, "token": uuid.uuid4().hex, "columns": combine(chunks)} for table, chunks in taken
        ]
        payload = pieces({"batches": batches})
        size = size_of(payload)
        _count, used = self.spool_size()
        if used + size > self.config.spool_max_bytes:
            for batch in batches:
                rows = rows_of(batch["columns"])
                self.metrics.dropped.labels(batch["table"]).inc(rows)
                log.error("spool full (%d bytes): dropped %d %s rows", used, rows, batch["table"])
            return
        names = "+".join(batch["table"] for batch in batches)
        path = self.spool / f"{seq:012d}-{names}-{batches[0]['token']}.batch"
        try:
            write_atomic(path, payload)
        except OSError:  # disk full / unwritable: the rows go back to the buffers, tried again later
            with self._lock:
                for table, chunks in taken:
                    self._buffers[table] = chunks + self._buffers.get(table, [])
                    self._counts[table] = self._counts.get(table, 0) + sum(rows_of(c) for c in chunks)
                    self._buffer_since.setdefault(table, time.monotonic())
            raise
        with self._lock:
            if self._fresh_bytes + size <= FRESH_MAX_BYTES:
                self._fresh[path.name] = (batches, size)
                self._fresh_bytes += size
        self._update_spool_metrics()

    def _read(self, path: Path) -> list[dict[str, Any]]:
        """A spooled file's batches: from memory when this writer has just spooled it."""
        with self._lock:
            fresh = self._fresh.pop(path.name, None)
            if fresh is not None:
                self._fresh_bytes -= fresh[1]
                return fresh[0]
        data = read_spool_file(path)
        return data.get("batches", [data])  # type: ignore[no-any-return]  # older versions: one table

    # ------------------------------------------------------------------ flushing
    def _due(self, force: bool) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [
                t
                for t in self._buffers
                if force
                or self._counts.get(t, 0) >= self.config.batch_rows
                or now - self._buffer_since[t] >= self.config.flush_interval_s
            ]

    def _reject(self, path: Path, batches: list[dict[str, Any]], index: int, reason: str) -> bool:
        """Set one table's batch of a spooled file aside in ``spool/rejected/`` (a file of its own)
        and keep the file's other batches; then go on with those. Returns ``_insert``'s answer."""
        batch = batches[index]
        table, rows = batch["table"], rows_of(batch["columns"])
        write_atomic(self.spool / "rejected" / f"{path.stem}-{table}.batch", pieces(batch))
        rest = batches[:index] + batches[index + 1 :]
        if rest:
            write_atomic(path, pieces({"batches": rest}))
        else:
            path.unlink()
        self._attempts.pop(path.name, None)
        self.metrics.rejected.labels(table).inc(rows)
        log.error("store refuses a %s batch (%s): moved to %s", table, reason, self.spool / "rejected")
        self._update_spool_metrics()
        return self._insert(path) if rest else True

    def _split(self, path: Path, batches: list[dict[str, Any]], index: int, reason: str) -> bool:
        """A raw batch the store keeps refusing: its chunks (each one client's body) become batches
        of their own in the same spool file, so that only the chunk it refuses is set aside; then
        go on. Returns ``_insert``'s answer."""
        batch = batches[index]
        raw: Raw = batch["columns"]
        data = raw.joined()  # a rare path: one copy to cut it by chunk
        parts, at = [], 0
        for i, (size, count) in enumerate(zip(raw.sizes, raw.counts, strict=True)):
            chunk = Raw(data[at : at + size], count, raw.fmt, raw.settings, (size,), (count,))
            parts.append({"table": batch["table"], "token": f"{batch['token']}-{i}", "columns": chunk})
            at += size
        write_atomic(path, pieces({"batches": batches[:index] + parts + batches[index + 1 :]}))
        self._attempts.pop(path.name, None)
        log.warning("store refuses a %s batch (%s): trying its %d parts one by one", batch["table"], reason, len(parts))
        return self._insert(path)

    def _insert(self, path: Path) -> bool:
        """Insert one spooled file (one batch per table); remove it when all landed. False when
        it must wait. A table inserted before another failed is inserted again on the retry,
        and its deduplication token makes the store drop the repeat."""
        batches = self._read(path)
        landed = []
        for index, batch in enumerate(batches):
            table, token, columns = batch["table"], batch["token"], batch["columns"]
            target = INSERT_INTO.get(table, table)
            frame = None
            if not isinstance(columns, Raw):
                try:
                    frame = _frame(columns)
                except (ValueError, OverflowError, TypeError) as exc:  # deterministic: retrying cannot help
                    return self._reject(path, batches, index, f"cannot build rows: {exc}")
            t0 = time.perf_counter()
            dedup = {"insert_deduplication_token": token, "deduplicate_blocks_in_dependent_materialized_views": 1}
            try:
                if isinstance(columns, Raw):
                    settings = {**dict(columns.settings), **dedup}
                    block = chunks(columns.pieces())  # streamed: to the embedded store's file, or the HTTP body
                    self.client.raw_insert(target, None, insert_block=block, fmt=columns.fmt, settings=settings)
                else:
                    self.client.insert_df(target, frame, settings=dedup)
            except Exception as exc:  # noqa: BLE001 - every store failure is handled the same way
                self.metrics.batches.labels(table, "error").inc()
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if not self._ping():  # an outage: not this batch's fault
                    self._attempts.pop(path.name, None)
                elif not any(marker in str(exc) for marker in _TRANSIENT) and not isinstance(exc, OSError):
                    tries = self._attempts[path.name] = self._attempts.get(path.name, 0) + 1
                    if tries >= self.config.max_attempts:
                        if isinstance(columns, Raw) and len(columns.sizes) > 1:
                            return self._split(path, batches, index, first)
                        return self._reject(path, batches, index, first)
                log.warning("insert into %s failed (%s); batch kept in the spool", table, first)
                return False
            landed.append((table, rows_of(columns), time.perf_counter() - t0))
        self._attempts.pop(path.name, None)
        for table, rows, seconds in landed:
            self.metrics.latency.labels(table).observe(seconds)
            self.metrics.rows.labels(table).inc(rows)
            self.metrics.batches.labels(table, "ok").inc()
        path.unlink()
        self._update_spool_metrics()
        return True

    def _default_ping(self) -> bool:
        try:
            self.client.query("SELECT 1")
            return True
        except Exception:  # noqa: BLE001
            return False

    def spool_due(self, force: bool = False) -> None:
        """Move due buffers to the spool (disk), all due tables in one file, without inserting."""
        due = self._due(force)
        if not due:
            return
        try:
            self._cut(*due)
        except OSError as exc:  # disk full / unwritable: the rows stay in memory, tried again later
            log.error("cannot spool %s rows: %s", ", ".join(due), exc)

    def flush(self, force: bool = True) -> bool:
        """Spool due buffers and insert every spooled batch in order. True when all landed."""
        with self._flush_lock:
            self.spool_due(force)
            for path in self._spooled():
                try:
                    done = self._insert(path)
                except FileNotFoundError:
                    continue
                if not done:
                    return False
            return True

    def _run(self) -> None:
        delay = self.config.retry_initial_s
        next_try = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_try:
                if self.flush(force=False):
                    delay = self.config.retry_initial_s
                    next_try = 0.0
                else:
                    jitter = 0.8 + 0.4 * (now % 1)
                    next_try = now + delay * jitter
                    delay = min(delay * 2, self.config.retry_max_s)
            else:
                self.spool_due()  # backing off: still move buffers to disk every interval
            self._wake.wait(self.config.flush_interval_s / 2)
            self._wake.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetscope-writer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop the thread and flush what is buffered; what cannot be inserted stays spooled."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # stuck in an insert: leave the rest in the spool
                self.spool_due(force=True)
                return False
        deadline = time.monotonic() + timeout_s
        ok = self.flush(force=True)
        while not ok and time.monotonic() < deadline:
            time.sleep(0.2)
            ok = self.flush(force=True)
        return ok

    def pending_rows(self) -> int:
        with self._lock:
            return sum(self._counts.values())
