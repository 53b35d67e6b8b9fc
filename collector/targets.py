"""Scrape targets: static config, the fleet spec and Prometheus-style file discovery -> ``Target``s.

In:  ``StaticTarget`` entries (from settings, or built from the fleet spec by the wiring in
     ``fleetscope``), and ``file_sd`` JSON files: ``[{"targets": ["host:port"], "labels": {...}}]``.
Out: ``Target`` objects, each with ``job``, ``instance``, its labels (``replica``, ``model``, any
     others), URL, interval and timeout. ``FileDiscovery.poll()`` re-reads a file when its
     modification time changes; a broken file keeps the last good targets and reports why.
     ``Shard`` picks this collector's part of the targets when several collectors share them
     (Prometheus ``hashmod``: md5 of the target's scrape URL, modulo the shard count).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import CollectorError

__all__ = ["FileDiscovery", "Shard", "Target", "TargetError", "make_target", "shard_of"]

_RESERVED = {"job", "instance"}


class TargetError(CollectorError, ValueError):
    """A target definition cannot be used; the message names the source."""


@dataclass(frozen=True)
class Target:
    job: str
    instance: str  # host:port
    url: str  # full /metrics URL
    labels: tuple[tuple[str, str], ...]  # sorted, without job/instance
    interval_s: float
    timeout_s: float

    @property
    def key(self) -> str:
        return f"{self.job}/{self.url}"

    @property
    def replica(self) -> str:
        return dict(self.labels).get("replica", self.instance)

    def all_labels(self) -> dict[str, str]:
        return {"job": self.job, "instance": self.instance, **dict(self.labels)}

    @property
    def shard_key(self) -> str:
        """What sharding hashes: the scrape URL (Prometheus hashes ``__address__``)."""
        return self.url

    def offset(self) -> float:
        """A stable phase within the interval, so scrapes of many targets spread out."""
        digest = hashlib.blake2b(self.key.encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "big") % 1_000_000) / 1_000_000 * self.interval_s


def shard_of(target: Target, shard_count: int) -> int:
    """The shard that scrapes ``target``: ``md5(scrape URL) mod shard_count``.

    The same in every process and on every machine (no per-process hash seed), so N
    collectors given the same target list split it without talking to each other.
    """
    digest = hashlib.md5(target.shard_key.encode(), usedforsecurity=False).hexdigest()
    return int(digest, 16) % shard_count


@dataclass(frozen=True)
class Shard:
    """One collector's part of the targets: those with ``shard_of(target, count) == index``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise TargetError(f"shard count must be >= 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise TargetError(f"shard index must be in 0..{self.count - 1}, got {self.index}")

    def owns(self, target: Target) -> bool:
        return self.count == 1 or shard_of(target, self.count) == self.index

    def select(self, targets: Iterable[Target]) -> list[Target]:
        """The targets this shard scrapes, in their given order."""
        return [t for t in targets if self.owns(t)]

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


def make_target(
    address: str,
    *,
    job: str,
    labels: dict[str, str] | None = None,
    interval_s: float,
    timeout_s: float,
    path: str = "/metrics",
    scheme: str = "http",
) -> Target:
    """Build a target from ``host:port`` (or a full URL) with validation."""
    if interval_s <= 0:
        raise TargetError(f"{address}: interval must be > 0")
    if not 0 < timeout_s <= interval_s:
        raise TargetError(f"{address}: timeout ({timeout_s:g}s) must be > 0 and <= interval ({interval_s:g}s)")
    if "://" in address:
        url = address
        instance = address.split("://", 1)[1].split("/", 1)[0]
    else:
        if ":" not in address:
            raise TargetError(f"target {address!r} must be host:port")
        instance = address
        url = f"{scheme}://{address}{path}"
    extra = dict(labels or {})
    bad = _RESERVED & set(extra)
    if bad:
        raise TargetError(f"{address}: labels {sorted(bad)} are set by the collector")
    return Target(job, instance, url, tuple(sorted(extra.items())), interval_s, timeout_s)


@dataclass
class FileDiscovery:
    """Prometheus ``file_sd`` style: re-read ``path`` when it changes."""

    path: Path
    job: str
    interval_s: float
    timeout_s: float
    targets: list[Target] = field(default_factory=list)
    error: str | None = None
    _mtime: float | None = None

    def poll(self) -> bool:
        """Re-read the file if it changed; True when the target list changed."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self.error = f"{self.path}: file not found"
            return False
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            new = self._read()
        except TargetError as exc:
            self.error = str(exc)  # keep the last good targets
            return False
        self.error = None
        changed = new != self.targets
        self.targets = new
        return changed

    def _read(self) -> list[Target]:
        try:
            groups: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TargetError(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(groups, list):
            raise TargetError(f"{self.path}: expected a list of target groups")
        out: list[Target] = []
        for index, group in enumerate(groups):
            if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
                raise TargetError(f'{self.path}: group {index} needs a "targets" list')
            labels = group.get("labels") or {}
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise TargetError(f"{self.path}: group {index} labels must map names to strings")
            job = labels.pop("job", self.job)
            for address in group["targets"]:
                if not isinstance(address, str):
                    raise TargetError(f"{self.path}: group {index}: target {address!r} is not a string")
                try:
                    out.append(
                        make_target(
                            address, job=job, labels=labels, interval_s=self.interval_s, timeout_s=self.timeout_s
                        )
                    )
                except TargetError as exc:
                    raise TargetError(f"{self.path}: group {index}: {exc}") from None
        return out
