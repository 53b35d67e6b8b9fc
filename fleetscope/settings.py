"""Settings: ``fleetscope.yaml`` + ``FLEETSCOPE_*`` environment -> a validated ``Settings``.

In:  a YAML file (``--config``, ``$FLEETSCOPE_CONFIG`` or ``./fleetscope.yaml``) and the
     process environment. Every leaf key has an environment override named after its path:
     ``clickhouse.url`` -> ``FLEETSCOPE_CLICKHOUSE_URL``, ``metadata.url`` ->
     ``FLEETSCOPE_METADATA_URL``. The environment wins over the file.
Out: a frozen pydantic ``Settings`` object, or one ``SettingsError`` whose message is a
     single line naming the file/line or variable, the key, and the problem. Nothing in
     fleetscope starts on a bad config.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from alerts.config import AlertsSettings
from analytics.cost import ReferencePrice, TokenWeights
from analytics.tiers import Retention
from collector.sampling import SamplingPolicy
from common.yamlfile import YamlConfigError, describe_validation_error, read_yaml
from storage.retention import Days

__all__ = [
    "ClickHouseSettings",
    "MetadataSettings",
    "Settings",
    "SettingsError",
    "env_var_for",
    "load_settings",
]

ENV_PREFIX = "FLEETSCOPE_"
CONFIG_ENV = "FLEETSCOPE_CONFIG"
DEFAULT_CONFIG_NAME = "fleetscope.yaml"
# FLEETSCOPE_* variables that are not settings keys.
_NON_SETTING_ENV = {CONFIG_ENV, "FLEETSCOPE_TEST_POSTGRES_URL"}


class SettingsError(Exception):
    """A configuration problem, already phrased as one line for the user."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetentionSettings(_Section):
    """Days each storage tier keeps its rows (0: forever); `fleetscope migrate` sets the TTLs."""

    raw_days: float = Field(default=7, ge=0, description="raw samples and scrapes")
    requests_days: float = Field(default=30, ge=0, description="the raw (sampled) request log")
    minute_days: float = Field(default=90, ge=0, description="1-minute rollups (samples_1m, requests_1m)")
    hour_days: float = Field(default=730, ge=0, description="1-hour and 6-hour rollups (samples_1h, requests_1h, samples_6h)")
    raw_max_span_hours: float = Field(
        default=6, gt=0, description="queries over windows up to this long read raw rows (while retained)"
    )
    minute_max_span_days: float = Field(
        default=7, gt=0, description="longer windows up to this long read the 1-minute rollups; beyond, 1-hour"
    )
    hour_max_span_days: float = Field(
        default=15, gt=0, description="longer windows up to this long read the 1-hour rollups; beyond, the 6-hour "
        "rollup of the samples (kept as long as hour_days)"
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
                raise ValueError(f"{name} ({getattr(self, name):g}) is shorter than {finer_name} ({shown}): "
                                 "coarser tiers should keep at least as long")
            finer_name, finer = name, keep
        return self

    def days(self) -> Days:
        return Days(raw=self.raw_days, requests=self.requests_days, minute=self.minute_days, hour=self.hour_days)

    def for_queries(self) -> Retention:
        return Retention(
            raw_days=self.raw_days, requests_days=self.requests_days, minute_days=self.minute_days,
            hour_days=self.hour_days, raw_max_span=timedelta(hours=self.raw_max_span_hours),
            minute_max_span=timedelta(days=self.minute_max_span_days),
            hour_max_span=timedelta(days=self.hour_max_span_days),
        )


class ClickHouseSettings(_Section):
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
                "must start with chdb: (embedded store) or http:// / https:// "
                f"(ClickHouse server), got {value!r}"
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


class MetadataSettings(_Section):
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
            raise ValueError(
                f"must be a sqlite:/// or postgresql:// URL, got {value!r}"
            )
        # psycopg 3 is the PostgreSQL driver fleetscope ships; SQLAlchemy's bare
        # postgresql:// would look for psycopg2.
        if scheme in {"postgresql", "postgres"}:
            value = "postgresql+psycopg://" + value.split("://", 1)[1]
        return value


class FleetSettings(_Section):
    """The bundled fleet (fleetscope fleet ...)."""

    spec: Path = Field(default=Path("fleet.yaml"), description="fleet spec file (replicas, models)")


class StaticTargets(_Section):
    job: str = Field(min_length=1)
    targets: list[str] = Field(min_length=1, description="host:port or full URLs")
    labels: dict[str, str] = Field(default_factory=dict)
    interval_s: float | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=None, gt=0)


class FileSd(_Section):
    path: Path
    job: str = "file_sd"
    interval_s: float | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=None, gt=0)


class CollectorSettings(_Section):
    """Intake: scrapes, OTLP spans and gateway logs into ClickHouse (fleetscope collect)."""

    listen_host: str = "127.0.0.1"
    otlp_http_port: int = Field(default=4318, ge=1, le=65535, description="OTLP/HTTP, gateway logs, /metrics")
    otlp_grpc_port: int = Field(default=4317, ge=0, le=65535, description="OTLP/gRPC; 0 disables it")
    scrape_interval_s: float = Field(default=5.0, gt=0)
    scrape_timeout_s: float = Field(default=4.0, gt=0)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    fleet_targets: bool = Field(default=True, description="scrape the replicas of the fleet spec")
    static_targets: list[StaticTargets] = Field(default_factory=list)
    file_sd: list[FileSd] = Field(default_factory=list)
    batch_rows: int = Field(default=50_000, gt=0)
    flush_interval_s: float = Field(default=1.0, gt=0)
    spool_max_bytes: int = Field(default=1024**3, gt=0)
    sampling: SamplingPolicy = SamplingPolicy()
    # shard_count comes before shard_index: the index is checked against the validated count.
    shard_count: int = Field(
        default=1, ge=1, description="collectors sharing the scrape targets (Prometheus hashmod)"
    )
    shard_index: int = Field(
        default=0, ge=0, description="this collector's shard, 0..shard_count-1"
    )

    @field_validator("shard_index")
    @classmethod
    def _index_within_count(cls, value: int, info: ValidationInfo) -> int:
        count = info.data.get("shard_count")
        if count is not None and value >= count:
            raise ValueError(
                f"must be less than collector.shard_count ({count}); shards are numbered "
                f"from 0, got {value}"
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


class ReferencePriceSettings(_Section):
    name: str = Field(min_length=1)
    input: float = Field(ge=0, description="USD per 1M input tokens")
    output: float = Field(ge=0, description="USD per 1M output tokens")
    cached: float | None = Field(default=None, ge=0, description="USD per 1M cached input tokens (default: input)")


class CostSettings(_Section):
    """How tokens share the GPU spend, and the API prices to compare the fleet with."""

    input_weight: float = Field(default=1.0, ge=0, description="a computed prompt token")
    cached_weight: float = Field(default=0.25, ge=0, description="a prompt token served from the prefix cache")
    output_weight: float = Field(default=4.0, ge=0, description="an output token")
    reference_prices: list[ReferencePriceSettings] = Field(
        default_factory=lambda: [
            ReferencePriceSettings(name="gpt-4o-mini (list, 2025)", input=0.15, cached=0.075, output=0.60),
            ReferencePriceSettings(name="gpt-4o (list, 2025)", input=2.50, cached=1.25, output=10.00),
        ],
        description="USD per 1M tokens of hosted APIs to compare the cost per token with",
    )

    @model_validator(mode="after")
    def _weights(self) -> CostSettings:
        if self.input_weight + self.output_weight <= 0:
            raise ValueError("input_weight + output_weight must be > 0")
        return self

    def weights(self) -> TokenWeights:
        return TokenWeights(input=self.input_weight, cached=self.cached_weight, output=self.output_weight)

    def references(self) -> list[ReferencePrice]:
        return [ReferencePrice(r.name, r.input, r.output, r.cached) for r in self.reference_prices]


class DashboardSettings(_Section):
    """Who may open the dashboard. On a loopback address nobody is asked; on any other address
    ``fleetscope dashboard`` refuses to start unless one of these is set."""

    password: SecretStr | None = Field(
        default=None, description="asked once per browser session (set it through FLEETSCOPE_DASHBOARD_PASSWORD)")
    oidc: bool = Field(
        default=False, description="log in with Streamlit's OIDC (st.login; the provider in .streamlit/secrets.toml [auth])")
    allowed_emails: list[str] = Field(
        default_factory=list,
        description="with oidc: the accounts let in, by address or by '@domain' (required: a provider accepts anyone it knows)")

    @field_validator("password", mode="after")
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("the dashboard password must be at least 8 characters")
        return value

    @model_validator(mode="after")
    def _oidc_allow_list(self) -> DashboardSettings:
        if self.oidc and not self.allowed_emails:
            raise ValueError("oidc needs allowed_emails (addresses, or '@example.com' for a domain): "
                             "the provider lets in anyone who has an account with it")
        return self

    def allows(self, email: str | None) -> bool:
        email = (email or "").strip().lower()
        if "@" not in email:
            return False
        wanted = {e.strip().lower() for e in self.allowed_emails}
        return email in wanted or email[email.index("@"):] in wanted

    @property
    def protected(self) -> bool:
        return self.password is not None or self.oidc


class SqlSettings(_Section):
    """Ad-hoc SQL (``fleetscope sql``, the dashboard's SQL page, the read-only query endpoint)."""

    token: SecretStr | None = Field(
        default=None, description="bearer token the query endpoint asks for (set it through FLEETSCOPE_SQL_TOKEN)")
    endpoint: str | None = Field(
        default=None, description="where `fleetscope sql` reaches a running fleetscope that holds the chDB store "
                                  "(default: the collector's HTTP address)")
    max_rows: int = Field(default=10_000, ge=1, le=1_000_000, description="most rows a query returns")
    timeout_s: float = Field(default=30.0, gt=0, le=3600, description="a query running longer is stopped")
    max_memory_bytes: int = Field(default=2 * 1024**3, ge=64 * 1024**2, description="memory a query may use")
    server_enforces_readonly: bool = Field(
        default=False, description="the ClickHouse server user's settings profile fixes readonly (docs/operations.md): "
                                   "fleetscope then does not send readonly=1, which such a profile refuses to change")

    @field_validator("token", mode="after")
    @classmethod
    def _token_length(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("the SQL endpoint token must be at least 16 characters")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {value!r}")
        return value


class Settings(_Section):
    """The whole configuration. Later sections (fleet, collector, alerts) add fields here."""

    data_dir: Path = Field(default=Path("data"), description="where local state is written")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    clickhouse: ClickHouseSettings = ClickHouseSettings()
    metadata: MetadataSettings = MetadataSettings()
    fleet: FleetSettings = FleetSettings()
    collector: CollectorSettings = CollectorSettings()
    cost: CostSettings = CostSettings()
    dashboard: DashboardSettings = DashboardSettings()
    alerts: AlertsSettings = AlertsSettings()
    sql: SqlSettings = SqlSettings()

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


# --------------------------------------------------------------------------- loading


def env_var_for(path: tuple[str, ...]) -> str:
    """The environment variable that overrides a settings key path."""
    return ENV_PREFIX + "_".join(part.upper() for part in path)


def _leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaf_paths(annotation, prefix + (name,))
        else:
            yield prefix + (name,)


def _apply_env(
    data: dict[str, Any], environ: Mapping[str, str]
) -> dict[tuple[str, ...], str]:
    """Overlay FLEETSCOPE_* variables onto ``data``; return path -> variable name used."""
    known = {env_var_for(path): path for path in _leaf_paths(Settings)}
    used: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in _NON_SETTING_ENV:
            continue
        path = known.get(name)
        if path is None:
            hint = difflib.get_close_matches(name, known, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            raise SettingsError(f"environment: {name} is not a fleetscope setting{suggestion}")
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        value: Any = None if raw == "" else raw
        if raw[:1] in ("[", "{"):  # lists and mappings as YAML/JSON flow text
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                raise SettingsError(f"environment: {name} is not valid YAML/JSON: {raw[:80]!r}") from None
        node[path[-1]] = value
        used[path] = name
    return used


def config_path(explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> tuple[Path | None, bool]:
    """Which file to read, and whether the user asked for it (then it must exist)."""
    environ = os.environ if environ is None else environ
    if explicit:
        return Path(explicit), True
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    default = Path(DEFAULT_CONFIG_NAME)
    return (default, False) if default.exists() else (None, False)


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read, overlay and validate the configuration. Raises ``SettingsError``."""
    environ = os.environ if environ is None else environ
    source, _ = config_path(path, environ)
    data: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    if source is not None:
        try:
            data, lines = read_yaml(source)
        except YamlConfigError as exc:
            raise SettingsError(str(exc)) from None
    from_env = _apply_env(data, environ)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(
            exc, Settings, str(source) if source else None, lines, from_env
        )
        raise SettingsError(message) from None
