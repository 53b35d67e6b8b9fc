"""The refresher: every ``interval_s``, each figure read again in a thread of its own, the last
answers kept for ``/metrics``.

In:  a way to open the ``Stores`` (called in the refresher's thread, again after it failed),
     ``Params``, the interval and a clock.
Out: ``Refresher.snapshot``: a ``Snapshot`` (when the last refresh was, how long it took, how
     many there were, each figure's last good ``Reading`` and its failed reads), replaced whole at
     the end of each refresh, so a scrape reads one refresh, never half of one, and never waits
     for the store. ``refresh()`` makes one in the caller's thread; ``start()``/``stop()`` run
     them in the background.

A read that fails (the store away, a GPU type without a price, no metadata DB) breaks nothing:
it is counted in ``Snapshot.errors``, the figure keeps its last good values (their own
``Reading.at`` says how old), and it is logged once when it begins failing and once when it is
read again. Reads take 0.1-1 s of queries, so they never run on the collector's event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from common.timeutil import utc_now
from exporter.errors import ReadFailed
from exporter.families import Sample
from exporter.read import READERS, Params, Reader, Stores

__all__ = ["Reading", "Refresher", "Snapshot"]

log = logging.getLogger("fleetscope.exporter")
STOP_WAIT_S = 30.0  # stop() waits this long for a refresh under way


@dataclass(frozen=True)
class Reading:
    """One figure's answer: its samples and the refresh they were read at."""

    at: datetime
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Snapshot:
    at: datetime | None = None  # the last refresh (every window ends there); None: none yet
    duration_s: float | None = None  # how long it took
    refreshes: int = 0
    readings: Mapping[str, Reading] = field(default_factory=dict)  # figure -> its last good answer
    errors: Mapping[str, int] = field(default_factory=dict)  # figure -> failed reads so far


def _reason(exc: BaseException) -> str:
    """An exception in one line (a store's messages run to many)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class Refresher:
    def __init__(
        self,
        open_stores: Callable[[], Stores],
        params: Params,
        *,
        interval_s: float = 30.0,
        clock: Callable[[], datetime] = utc_now,
        readers: Mapping[str, Reader] = READERS,
    ) -> None:
        self.params = params
        self.interval_s = interval_s
        self.snapshot = Snapshot()
        self._open = open_stores
        self._clock = clock
        self._readers = dict(readers)
        self._stores: Stores | None = None
        self._failing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(self._readers)

    def refresh(self) -> dict[str, ReadFailed]:
        """Read every figure now, as of the clock's whole second; the reads that failed."""
        at = self._clock().replace(microsecond=0)
        began = time.monotonic()
        last = self.snapshot
        readings = dict(last.readings)
        failed: dict[str, ReadFailed] = {}
        try:
            if self._stores is None:
                self._stores = self._open()
            stores = self._stores
        except Exception as exc:  # noqa: BLE001 - a store away must not break /metrics: counted, logged once
            failed = {name: ReadFailed(f"the store could not be opened ({_reason(exc)})") for name in self._readers}
        else:
            for name, read in self._readers.items():
                try:
                    readings[name] = Reading(at, tuple(read(stores, at, self.params)))
                except Exception as exc:  # noqa: BLE001 - one figure's failure is counted, the others still read
                    failed[name] = ReadFailed(f"{_reason(exc)}")
        errors = dict(last.errors)
        for name in failed:
            errors[name] = errors.get(name, 0) + 1
        self._log(failed)
        self.snapshot = Snapshot(at, time.monotonic() - began, last.refreshes + 1, readings, errors)
        return failed

    def _log(self, failed: Mapping[str, ReadFailed]) -> None:
        new = {name: error for name, error in failed.items() if name not in self._failing}
        if new:
            log.warning(
                "fleetscope's numbers: could not read %s; /metrics keeps their last values "
                "(fleetscope_exporter_figure_timestamp_seconds says how old) and counts each failed read "
                "(fleetscope_exporter_refresh_errors_total); said once until they are read again",
                "; ".join(f"{name} ({error})" for name, error in new.items()),
            )
        back = sorted(self._failing - set(failed))
        if back:
            log.info("fleetscope's numbers: %s read again", ", ".join(back))
        self._failing = set(failed)

    # ------------------------------------------------------------------ background
    def start(self) -> None:
        """Refresh now and every ``interval_s`` in a thread of its own, until ``stop()``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="exporter-refresh", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    self.refresh()
                except Exception:  # the loop outlives any mistake; its reads' failures are counted above
                    log.exception("fleetscope's numbers: the refresh failed")
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
        finally:
            self._close()

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Stop refreshing (a refresh under way ends first, up to ``timeout_s``); close the stores."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        else:
            self._close()

    def _close(self) -> None:
        stores, self._stores = self._stores, None
        if stores is not None:
            try:
                stores.close()
            except Exception as exc:  # noqa: BLE001 - closing on the way out: say so, go on
                log.warning("fleetscope's numbers: closing the stores failed (%s)", _reason(exc))
