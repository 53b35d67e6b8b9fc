"""Metadata DB: SQLAlchemy 2 models and engine/session helpers.

In:  an SQLAlchemy URL (``sqlite:///data/metadata.db`` by default, ``postgresql+psycopg://``
     in production).
Out: ``Engine`` / ``Session`` objects and the ORM models below. The schema itself is
     created and changed only by the alembic revisions in ``migrations/metadata/versions``;
     ``Base.metadata`` is what they are checked against.

Tables (later issues add theirs through new revisions):
    gpu_prices   price per GPU-hour by GPU type (cost analytics)
    replicas     inventory: replica name, model, GPU type/count, endpoint
    slos         per-model latency objectives (TTFT, ITL/TPOT, e2e)
    annotations  marks on the timeline (deploys, incidents, notes)
    leases       named active/standby locks with an expiry (used through ``storage.leases``)
    alert_states   each rule instance's current state (pending/firing/resolved), so a restart
                   neither re-pages nor forgets a pending ``for``
    alert_groups   per receiver and group: what was last notified and when (group_interval,
                   repeat_interval survive a restart)
    alert_outbox   notifications to deliver, at least once, each with an idempotency key
    silences       matchers that mute notifications between two times
    alert_evaluations  each rule group's last evaluation: when, how long, and the rules that failed
    saved_queries  ad-hoc SQL kept by name (the dashboard's SQL page, ``adhoc.saved``)
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    func,
)
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from common.timeutil import as_utc, aware_utc

__all__ = [
    "AlertEvaluation",
    "AlertGroup",
    "AlertOutbox",
    "AlertState",
    "Annotation",
    "Base",
    "GpuPrice",
    "Lease",
    "Replica",
    "SavedQuery",
    "Silence",
    "Slo",
    "UtcDateTime",
    "make_engine",
    "make_sessionmaker",
]


class UtcDateTime(TypeDecorator[datetime]):
    """A point in time, in UTC both ways: a value bound must carry its zone (a naive one is an
    error, not a guess) and is stored as UTC; a value read back is UTC-aware, also from SQLite,
    which keeps the wall time and drops the offset."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else aware_utc(value, "stored times")

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


# Stable constraint names, so that alembic revisions can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class _Timestamps:
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        UtcDateTime(), server_default=func.now(), onupdate=func.now(), nullable=False
    )


class GpuPrice(_Timestamps, Base):
    """What one GPU of a type costs per hour (on-demand or contracted)."""

    __tablename__ = "gpu_prices"
    __table_args__ = (CheckConstraint("usd_per_gpu_hour >= 0", name="price_non_negative"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    usd_per_gpu_hour: Mapped[float] = mapped_column(Float, nullable=False)
    note: Mapped[str | None] = mapped_column(Text)


class Replica(_Timestamps, Base):
    """One serving replica of the fleet (inventory; metrics carry its name as a label)."""

    __tablename__ = "replicas"
    __table_args__ = (CheckConstraint("gpu_count >= 0", name="gpu_count_non_negative"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    gpu_type: Mapped[str] = mapped_column(String(64), nullable=False)
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    endpoint: Mapped[str] = mapped_column(String(512), nullable=False)


class Slo(_Timestamps, Base):
    """A latency objective for one model: e.g. p99 TTFT <= 2 s for 99% of a 30-day window."""

    __tablename__ = "slos"
    __table_args__ = (
        UniqueConstraint("model", "metric", name="uq_slos_model_metric"),
        CheckConstraint("metric IN ('ttft', 'itl', 'tpot', 'e2e')", name="metric_known"),
        CheckConstraint("threshold_seconds > 0", name="threshold_positive"),
        CheckConstraint("objective > 0 AND objective < 1", name="objective_ratio"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    metric: Mapped[str] = mapped_column(String(16), nullable=False)
    # A request is "good" when metric <= threshold_seconds; ``percentile`` (e.g. 0.99) is
    # the percentile shown against the threshold on latency charts.
    threshold_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    percentile: Mapped[float | None] = mapped_column(Float)
    objective: Mapped[float] = mapped_column(Float, nullable=False, default=0.99)
    window_days: Mapped[int] = mapped_column(Integer, nullable=False, default=30)


class Annotation(Base):
    """A mark on the timeline: a deploy, a config change, an incident note."""

    __tablename__ = "annotations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    starts_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False, index=True)
    ends_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    title: Mapped[str] = mapped_column(String(256), nullable=False)
    text: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    created_by: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now(), nullable=False)


class Lease(Base):
    """Who holds a named lease, and until when (``storage.leases`` reads and changes these rows).

    Times are UTC. The holder keeps the lease by renewing it before ``expires_at``; after that
    any other holder may take it over.
    """

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256), nullable=False)
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    renewed_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)


class AlertState(Base):
    """The current state of one alert instance (a rule and a label set)."""

    __tablename__ = "alert_states"
    __table_args__ = (
        UniqueConstraint("rule", "fingerprint", name="uq_alert_states_rule_fingerprint"),
        CheckConstraint("state IN ('pending', 'firing', 'resolved')", name="state_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule: Mapped[str] = mapped_column(String(256), nullable=False)
    fingerprint: Mapped[str] = mapped_column(String(32), nullable=False)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    value: Mapped[float | None] = mapped_column(Float)
    active_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)  # condition first true
    fired_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_true_at: Mapped[datetime | None] = mapped_column(UtcDateTime())  # for keep_firing_for
    resolved_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    evaluated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)


class AlertEvaluation(Base):
    """A rule group's last evaluation (what the Alerts page shows as the evaluator's health)."""

    __tablename__ = "alert_evaluations"

    group_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    evaluated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    seconds: Mapped[float] = mapped_column(Float, nullable=False)
    rules: Mapped[int] = mapped_column(Integer, nullable=False)
    errors: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)  # rule -> message


class AlertGroup(Base):
    """What one receiver was last told about one group of alerts, and when."""

    __tablename__ = "alert_groups"
    __table_args__ = (UniqueConstraint("receiver", "group_key", name="uq_alert_groups_receiver_group_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    receiver: Mapped[str] = mapped_column(String(128), nullable=False)
    group_key: Mapped[str] = mapped_column(String(512), nullable=False)
    # when the group's current episode began (None: closed, nothing firing; the row stays so that
    # ``sequence``, part of the idempotency keys, keeps counting when the group opens again)
    first_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    digest: Mapped[str | None] = mapped_column(String(64))  # the alerts and statuses last sent
    sequence: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # the group's labels and the firing alerts last sent: one that leaves the group (resolved and
    # dropped, silenced, inhibited, its rule removed, across a restart) is told as resolved from this
    sent: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class AlertOutbox(Base):
    """A notification waiting for (or done with) delivery; ``key`` makes enqueueing idempotent."""

    __tablename__ = "alert_outbox"
    __table_args__ = (CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status_known"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    receiver: Mapped[str] = mapped_column(String(128), nullable=False)
    body: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_status: Mapped[int | None] = mapped_column(Integer)  # the receiver's last HTTP status
    last_error: Mapped[str | None] = mapped_column(Text)


class Silence(Base):
    """Mutes notifications of alerts matching every matcher between ``starts_at`` and ``ends_at``."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[list[Any]] = mapped_column(JSON, nullable=False)  # [[name, op, value], ...]
    starts_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    ends_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False, index=True)
    created_by: Mapped[str] = mapped_column(String(128), nullable=False)
    comment: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now(), nullable=False)


class SavedQuery(_Timestamps, Base):
    """An ad-hoc query kept by name."""

    __tablename__ = "saved_queries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    sql: Mapped[str] = mapped_column(Text, nullable=False)
    description: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(128))


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; creates the directory of a SQLite file if needed."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
    return create_engine(url, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Any]:
    return sessionmaker(bind=engine, expire_on_commit=False)
