"""Prices, SLOs and timeline annotations kept in the metadata DB: read them for analytics, change them from the CLI
or a page.

In:  an SQLAlchemy ``sessionmaker`` bound to the metadata DB (``storage.metadata``).
Out: ``gpu_prices`` -> ``{gpu_type: USD per GPU-hour}``; ``set_gpu_price`` upserts one;
     ``delete_gpu_price``;
     ``slo_targets`` -> ``SloTarget`` values (plain data, detached from the session);
     ``set_slo`` upserts one per (model, metric); ``delete_slo``; ``annotations_in`` -> the marks
     overlapping a window (``Mark`` values), ``add_annotation``, ``delete_annotation``. Bad values
     are refused with a ``ValueError`` naming the field before the database sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, delete, or_, select

from storage.metadata import Annotation, GpuPrice, Slo

__all__ = [
    "METRICS",
    "Mark",
    "SloTarget",
    "add_annotation",
    "annotations_in",
    "check_slo",
    "delete_annotation",
    "delete_gpu_price",
    "delete_slo",
    "gpu_prices",
    "set_gpu_price",
    "set_slo",
    "slo_targets",
]

METRICS = ("ttft", "itl", "tpot", "e2e")


@dataclass(frozen=True)
class SloTarget:
    """A request meets it when its ``metric`` <= ``threshold_seconds``; the objective is the share
    of requests that must (e.g. 0.99 of requests within 2 s, i.e. p99 <= 2 s) over ``window_days``."""

    model: str
    metric: str
    threshold_seconds: float
    objective: float = 0.99
    window_days: int = 30
    percentile: float | None = None  # the percentile drawn against the threshold (default: the objective)

    @property
    def label(self) -> str:
        p = self.percentile or self.objective
        return f"{self.model} {self.metric} p{p * 100:g} <= {self.threshold_seconds:g}s"


def gpu_prices(sessions: Any) -> dict[str, float]:
    with sessions() as s:
        return {row.gpu_type: float(row.usd_per_gpu_hour) for row in s.scalars(select(GpuPrice))}


def set_gpu_price(sessions: Any, gpu_type: str, usd_per_gpu_hour: float, note: str | None = None) -> None:
    if not gpu_type.strip():
        raise ValueError("gpu_type must not be empty")
    if not usd_per_gpu_hour >= 0:  # also refuses NaN
        raise ValueError(f"usd_per_gpu_hour must be >= 0, got {usd_per_gpu_hour}")
    with sessions.begin() as s:
        row = s.scalars(select(GpuPrice).where(GpuPrice.gpu_type == gpu_type)).one_or_none()
        if row is None:
            s.add(GpuPrice(gpu_type=gpu_type, usd_per_gpu_hour=usd_per_gpu_hour, note=note))
        else:
            row.usd_per_gpu_hour = usd_per_gpu_hour
            if note is not None:
                row.note = note


def check_slo(target: SloTarget) -> None:
    """Raise ``ValueError`` naming the field when ``target`` cannot be stored."""
    if target.metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {target.metric!r}")
    if not target.threshold_seconds > 0:
        raise ValueError(f"threshold_seconds must be > 0, got {target.threshold_seconds}")
    if not 0 < target.objective < 1:
        raise ValueError(f"objective must be within (0, 1), e.g. 0.99, got {target.objective}")
    if target.window_days < 1:
        raise ValueError(f"window_days must be >= 1, got {target.window_days}")
    if target.percentile is not None and not 0 < target.percentile < 1:
        raise ValueError(f"percentile must be within (0, 1), e.g. 0.99, got {target.percentile}")


def slo_targets(sessions: Any, model: str | None = None) -> list[SloTarget]:
    with sessions() as s:
        query = select(Slo).order_by(Slo.model, Slo.metric)
        if model is not None:
            query = query.where(Slo.model == model)
        return [
            SloTarget(
                r.model,
                r.metric,
                float(r.threshold_seconds),
                float(r.objective),
                int(r.window_days),
                None if r.percentile is None else float(r.percentile),
            )
            for r in s.scalars(query)
        ]


def set_slo(sessions: Any, target: SloTarget) -> None:
    check_slo(target)
    with sessions.begin() as s:
        row = s.scalars(select(Slo).where(Slo.model == target.model, Slo.metric == target.metric)).one_or_none()
        if row is None:
            row = Slo(model=target.model, metric=target.metric)
            s.add(row)
        row.threshold_seconds, row.objective = target.threshold_seconds, target.objective
        row.window_days, row.percentile = target.window_days, target.percentile


def delete_gpu_price(sessions: Any, gpu_type: str) -> bool:
    with sessions.begin() as s:
        return bool(s.execute(delete(GpuPrice).where(GpuPrice.gpu_type == gpu_type)).rowcount)


def delete_slo(sessions: Any, model: str, metric: str) -> bool:
    with sessions.begin() as s:
        return bool(s.execute(delete(Slo).where(Slo.model == model, Slo.metric == metric)).rowcount)


@dataclass(frozen=True)
class Mark:
    """An annotation: a deploy, a config change, an incident note (``ends_at`` for a span)."""

    id: int
    starts_at: datetime
    title: str
    ends_at: datetime | None = None
    text: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    created_by: str | None = None


def annotations_in(sessions: Any, start: datetime, end: datetime) -> list[Mark]:
    """The marks that start before ``end`` and have not ended before ``start``, oldest first."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    with sessions() as s:
        query = (
            select(Annotation)
            .where(Annotation.starts_at < end)
            .where(or_(and_(Annotation.ends_at.is_(None), Annotation.starts_at >= start), Annotation.ends_at >= start))
            .order_by(Annotation.starts_at)
        )
        return [
            Mark(r.id, r.starts_at, r.title, r.ends_at, r.text, dict(r.tags or {}), r.created_by)
            for r in s.scalars(query)
        ]


def add_annotation(
    sessions: Any,
    starts_at: datetime,
    title: str,
    *,
    ends_at: datetime | None = None,
    text: str | None = None,
    tags: dict[str, Any] | None = None,
    created_by: str | None = None,
) -> int:
    if not title.strip():
        raise ValueError("title must not be empty")
    if len(title) > 256:
        raise ValueError(f"title must be at most 256 characters, got {len(title)}")
    if starts_at.tzinfo is None:
        raise ValueError("starts_at must carry a timezone (UTC)")
    if ends_at is not None and ends_at < starts_at:
        raise ValueError("ends_at must not be before starts_at")
    starts_at = starts_at.astimezone(UTC)  # SQLite keeps the wall time and drops the offset
    ends_at = ends_at.astimezone(UTC) if ends_at is not None else None
    with sessions.begin() as s:
        row = Annotation(
            starts_at=starts_at, ends_at=ends_at, title=title.strip(), text=text, tags=tags or {}, created_by=created_by
        )
        s.add(row)
        s.flush()
        return int(row.id)


def delete_annotation(sessions: Any, annotation_id: int) -> bool:
    with sessions.begin() as s:
        return bool(s.execute(delete(Annotation).where(Annotation.id == annotation_id)).rowcount)
