"""The collector's configuration, declared once: the ``collector`` section of ``fleetscope.yaml``
and the defaults the collector's own parts (``collector.service``, ``collector.writer``) use.

In:  the ``collector`` section (``fleetscope.settings`` composes it).
Out: ``CollectorSettings`` (validated, frozen) and the named defaults below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from collector.mapping import RequestMapping
from collector.sampling import SamplingPolicy
from common.config import Section

__all__ = [
    "BATCH_ROWS",
    "FLUSH_INTERVAL_S",
    "GRPC_PORT",
    "HTTP_PORT",
    "LISTEN_HOST",
    "MAX_BODY_BYTES",
    "SPOOL_MAX_BYTES",
    "CollectorSettings",
    "FileSd",
    "RemoteWriteSettings",
    "StaticTargets",
]

LISTEN_HOST = "127.0.0.1"
HTTP_PORT = 4318  # OTLP/HTTP, gateway logs, /metrics
GRPC_PORT = 4317  # OTLP/gRPC; 0 disables it
MAX_BODY_BYTES = 16 * 1024 * 1024  # a scrape or request body
BATCH_ROWS = 50_000  # rows per insert
FLUSH_INTERVAL_S = 1.0  # the longest a row waits for its batch
SPOOL_MAX_BYTES = 1024**3  # the disk spool for batches ClickHouse refused
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class StaticTargets(Section):
    job: str = Field(min_length=1)
    targets: list[str] = Field(min_length=1, description="host:port or full URLs")
    labels: dict[str, str] = Field(default_factory=dict)
    interval_s: float | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=None, gt=0)


class FileSd(Section):
    path: Path
    job: str = "file_sd"
    interval_s: float | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=None, gt=0)


class RemoteWriteSettings(Section):
    """``collector.remote_write``: Prometheus remote-write in (``POST /api/v1/write``)."""

    replica_labels: list[str] = Field(
        default=["replica", "pod", "instance"],
        min_length=1,
        description="the first of these labels a series carries names its replica (stored as `replica`)",
    )
    max_decoded_bytes: int = Field(default=64 * 1024 * 1024, gt=0, description="the largest body after snappy")

    @field_validator("replica_labels")
    @classmethod
    def _label_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not _LABEL_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"not Prometheus label names: {', '.join(map(repr, bad))}")
        return value


class CollectorSettings(Section):
    """Intake: scrapes, OTLP spans and gateway logs into ClickHouse (fleetscope collect)."""

    listen_host: str = LISTEN_HOST
    otlp_http_port: int = Field(default=HTTP_PORT, ge=1, le=65535, description="OTLP/HTTP, gateway logs, /metrics")
    otlp_grpc_port: int = Field(default=GRPC_PORT, ge=0, le=65535, description="OTLP/gRPC; 0 disables it")
    scrape_interval_s: float = Field(default=5.0, gt=0)
    scrape_timeout_s: float = Field(default=4.0, gt=0)
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    fleet_targets: bool = Field(default=True, description="scrape the replicas of the fleet spec")
    static_targets: list[StaticTargets] = Field(default_factory=list)
    file_sd: list[FileSd] = Field(default_factory=list)
    batch_rows: int = Field(default=BATCH_ROWS, gt=0)
    flush_interval_s: float = Field(default=FLUSH_INTERVAL_S, gt=0)
    spool_max_bytes: int = Field(default=SPOOL_MAX_BYTES, gt=0)
    sampling: SamplingPolicy = SamplingPolicy()
    request_mappings: list[RequestMapping] = Field(
        default_factory=list,
        description="other gateways' request telemetry: which attribute is the tenant, route, backend ... "
        "(tried before the shipped mappings for LiteLLM, Envoy and OpenTelemetry GenAI; docs/gateways.md)",
    )
    shipped_mappings: list[Literal["litellm", "envoy", "genai"]] = Field(
        default=["litellm", "envoy", "genai"],
        description="the shipped request mappings in use; leave out genai when GenAI spans come from clients "
        "that see part of the traffic (their rows would stand for the whole)",
    )
    otlp_decode: Literal["clickhouse", "python"] = Field(
        default="clickhouse",
        description="who decodes OTLP protobuf bodies: ClickHouse (its Protobuf input format; falls back to "
        "python when the store lacks format_schema_source) or the collector",
    )
    remote_write: RemoteWriteSettings = RemoteWriteSettings()
    # shard_count comes before shard_index: the index is checked against the validated count.
    shard_count: int = Field(default=1, ge=1, description="collectors sharing the scrape targets (Prometheus hashmod)")
    shard_index: int = Field(default=0, ge=0, description="this collector's shard, 0..shard_count-1")

    @field_validator("shard_index")
    @classmethod
    def _index_within_count(cls, value: int, info: ValidationInfo) -> int:
        count = info.data.get("shard_count")
        if count is not None and value >= count:
            raise ValueError(
                f"must be less than collector.shard_count ({count}); shards are numbered from 0, got {value}"
            )
        return value

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> CollectorSettings:
        if self.scrape_timeout_s > self.scrape_interval_s:
            raise ValueError(
                f"scrape_timeout_s ({self.scrape_timeout_s:g}) must not exceed scrape_interval_s "
                f"({self.scrape_interval_s:g})"
            )
        return self
