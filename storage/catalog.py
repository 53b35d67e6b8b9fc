"""Prices and SLOs kept in the metadata DB: read them for analytics, change them from the CLI
or a page.

In:  an SQLAlchemy ``sessionmaker`` bound to the metadata DB (``storage.metadata``).
Out: ``gpu_prices`` -> ``{gpu_type: USD per GPU-hour}``; ``set_gpu_price`` upserts one;
     ``slo_targets`` -> ``SloTarget`` values (plain data, detached from the session);
     ``set_slo`` upserts one per (model, metric); ``delete_slo``. Bad values are refused with a
     ``ValueError`` naming the field before the database sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from storage.metadata import GpuPrice, Slo

__all__ = ["METRICS", "SloTarget", "delete_slo", "gpu_prices", "set_gpu_price", "set_slo", "slo_targets"]

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


def _check(target: SloTarget) -> None:
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
        return [SloTarget(r.model, r.metric, float(r.threshold_seconds), float(r.objective), int(r.window_days),
                          None if r.percentile is None else float(r.percentile)) for r in s.scalars(query)]


def set_slo(sessions: Any, target: SloTarget) -> None:
    _check(target)
    with sessions.begin() as s:
        row = s.scalars(select(Slo).where(Slo.model == target.model, Slo.metric == target.metric)).one_or_none()
        if row is None:
            row = Slo(model=target.model, metric=target.metric)
            s.add(row)
        row.threshold_seconds, row.objective = target.threshold_seconds, target.objective
        row.window_days, row.percentile = target.window_days, target.percentile


def delete_slo(sessions: Any, model: str, metric: str) -> bool:
    with sessions.begin() as s:
        return s.execute(delete(Slo).where(Slo.model == model, Slo.metric == metric)).rowcount > 0
