"""Settings: ``fleetscope.yaml`` + ``FLEETSCOPE_*`` environment -> a validated ``Settings``.

In:  a YAML file (``--config``, ``$FLEETSCOPE_CONFIG`` or ``./fleetscope.yaml``) and the
     process environment (``common.config``: every leaf key has an override named after its
     path, ``clickhouse.url`` -> ``FLEETSCOPE_CLICKHOUSE_URL``; the environment wins).
Out: a frozen pydantic ``Settings`` object composed of each component's own section (declared
     beside the component: ``storage.config``, ``collector.config``, ``analytics.config``,
     ``alerts.config``, ``dashboard.config``, ``adhoc.config``, ``exporter.config``), or one
     ``SettingsError`` whose message is a single line naming the file/line or variable, the
     key, and the problem.
     Nothing in fleetscope starts on a bad config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from adhoc.config import SqlSettings
from alerts.config import AlertsSettings
from analytics.config import CostSettings, ReferencePriceSettings
from collector.config import CollectorSettings, FileSd, StaticTargets
from common.config import ConfigError, Section, config_path, env_var_for, load_config
from dashboard.config import DashboardSettings
from exporter.config import ExporterSettings
from storage.config import ClickHouseSettings, MetadataSettings, RetentionSettings

__all__ = [
    "ClickHouseSettings",
    "CollectorSettings",
    "CostSettings",
    "DashboardSettings",
    "ExporterSettings",
    "FileSd",
    "FleetSettings",
    "MetadataSettings",
    "ReferencePriceSettings",
    "RetentionSettings",
    "Settings",
    "SettingsError",
    "SqlSettings",
    "StaticTargets",
    "config_path",
    "env_var_for",
    "load_settings",
]

SettingsError = ConfigError  # the name the commands and tests know


class FleetSettings(Section):
    """The bundled fleet (fleetscope fleet ...)."""

    spec: Path = Field(default=Path("fleet.yaml"), description="fleet spec file (replicas, models)")


class Settings(Section):
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
    exporter: ExporterSettings = ExporterSettings()

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def load_settings(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read, overlay and validate the configuration. Raises ``SettingsError``."""
    return load_config(Settings, path, environ)
