"""The stores' configuration: where telemetry lives (``clickhouse``), how long each tier keeps it
(``clickhouse.retention``) and where configuration and state live (``metadata``).

In:  the ``clickhouse`` and ``metadata`` sections of ``fleetscope.yaml`` (``fleetscope.settings``
     composes them; ``migrations`` reads ``metadata`` alone when alembic runs by hand).
Out: validated, frozen sections; ``RetentionSettings.days()`` for the table TTLs
     (``storage.retention``) and ``for_queries()`` for the tier planner (``Retention``).
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from common.config import Section
from storage.retention import Days, Retention

__all__ = ["ClickHouseSettings", "MetadataSettings", "RetentionSettings"]


class RetentionSettings(Section):
    """Days each storage tier keeps its rows (0: forever); `fleetscope migrate` sets the TTLs."""

    raw_days: float = Field(default=7, ge=0, description="raw samples and scrapes")
    requests_days: float = Field(default=30, ge=0, description="the raw (sampled) request log")
    minute_days: float = Field(default=90, ge=0, description="1-minute rollups (samples_1m, requests_1m)")
    hour_days: float = Field(
        default=730, ge=0, description="1-hour and 6-hour rollups (samples_1h, requests_1h, samples_6h)"
    )
    raw_max_span_hours: float = Field(
        default=6, gt=0, description="queries over windows up to this long read raw rows (while retained)"
    )
    minute_max_span_days: float = Field(
        default=7, gt=0, description="longer windows up to this long read the 1-minute rollups; beyond, 1-hour"
    )
    hour_max_span_days: float = Field(
        default=15,
        gt=0,
        description="longer windows up to this long read the 1-hour rollups; beyond, the 6-hour "
        "rollup of the samples (kept as long as hour_days)",
    )

    @model_validator(mode="after")
    def _tiers_nest(self) -> RetentionSettings:
        def days(value: float) -> float:
            return float("inf") if value == 0 else value  # 0 keeps forever

        finer_name, finer = "raw_days", days(self.raw_days)
        for name in ("minute_days", "hour_days"):
            keep = days(getattr(self, name))
            if keep < finer:
                shown = "forever (0)" if finer == float("inf") else f"{finer:g} days"
                raise ValueError(
                    f"{name} ({getattr(self, name):g}) is shorter than {finer_name} ({shown}): "
                    "coarser tiers should keep at least as long"
                )
            finer_name, finer = name, keep
        return self

    def days(self) -> Days:
        return Days(raw=self.raw_days, requests=self.requests_days, minute=self.minute_days, hour=self.hour_days)

    def for_queries(self) -> Retention:
        return Retention(
            raw_days=self.raw_days,
            requests_days=self.requests_days,
            minute_days=self.minute_days,
            hour_days=self.hour_days,
            raw_max_span=timedelta(hours=self.raw_max_span_hours),
            minute_max_span=timedelta(days=self.minute_max_span_days),
            hour_max_span=timedelta(days=self.hour_max_span_days),
        )


class ClickHouseSettings(Section):
    """Where telemetry lives: embedded chDB (``chdb:PATH``) or a server (``http(s)://``)."""

    url: str = Field(
        default="chdb:data/clickhouse",
        description="chdb:PATH (relative to the working directory, or chdb:///abs/path) "
        "or http(s)://user:password@host:port/database",
    )
    cluster: str | None = Field(
        default=None,
        description="ClickHouse cluster name; set it to emit ON CLUSTER DDL with "
        "Replicated*/Distributed tables (server only)",
    )
    connect_timeout_s: float = Field(default=10.0, gt=0)
    query_timeout_s: float = Field(default=300.0, gt=0)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        scheme = value.split(":", 1)[0].lower() if ":" in value else ""
        if scheme not in {"chdb", "http", "https"}:
            raise ValueError(
                f"must start with chdb: (embedded store) or http:// / https:// (ClickHouse server), got {value!r}"
            )
        if scheme == "chdb" and not value[len("chdb:") :].lstrip("/"):
            raise ValueError("chdb: needs a directory, e.g. chdb:data/clickhouse")
        if scheme in {"http", "https"} and not urlsplit(value).hostname:
            raise ValueError(f"has no host: {value!r}")
        return value

    @field_validator("cluster")
    @classmethod
    def _check_cluster(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"must be a plain cluster name (letters, digits, _ -), got {value!r}")
        return value


class MetadataSettings(Section):
    """Where configuration and state live: SQLite (default) or PostgreSQL."""

    url: str = Field(
        default="sqlite:///data/metadata.db",
        description="SQLAlchemy URL: sqlite:///PATH or postgresql://user@host:port/db",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        dialect = scheme.split("+", 1)[0]
        if dialect not in {"sqlite", "postgresql", "postgres"}:
            raise ValueError(f"must be a sqlite:/// or postgresql:// URL, got {value!r}")
        # psycopg 3 is the PostgreSQL driver fleetscope ships; SQLAlchemy's bare
        # postgresql:// would look for psycopg2.
        if scheme in {"postgresql", "postgres"}:
            value = "postgresql+psycopg://" + value.split("://", 1)[1]
        return value
