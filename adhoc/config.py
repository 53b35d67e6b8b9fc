"""Ad-hoc SQL's configuration: the ``sql`` section of ``fleetscope.yaml`` (``fleetscope sql``,
the dashboard's SQL page, the read-only query endpoint).

In:  the section (``fleetscope.settings`` composes it).
Out: ``SqlSettings`` (validated, frozen) and its ``limits()`` for ``adhoc.runner``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from adhoc.runner import Limits
from common.config import Section

__all__ = ["SqlSettings"]


class SqlSettings(Section):
    """Ad-hoc SQL (``fleetscope sql``, the dashboard's SQL page, the read-only query endpoint)."""

    token: SecretStr | None = Field(
        default=None, description="bearer token the query endpoint asks for (set it through FLEETSCOPE_SQL_TOKEN)"
    )
    endpoint: str | None = Field(
        default=None,
        description="where `fleetscope sql` reaches a running fleetscope that holds the chDB store "
        "(default: the collector's HTTP address)",
    )
    max_rows: int = Field(default=Limits.max_rows, ge=1, le=1_000_000, description="most rows a query returns")
    timeout_s: float = Field(default=Limits.timeout_s, gt=0, le=3600, description="a query running longer is stopped")
    max_memory_bytes: int = Field(
        default=Limits.max_memory_bytes, ge=64 * 1024**2, description="memory a query may use"
    )
    server_enforces_readonly: bool = Field(
        default=False,
        description="the ClickHouse server user's settings profile fixes readonly (docs/operations.md): "
        "fleetscope then does not send readonly=1, which such a profile refuses to change",
    )

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

    def limits(self) -> Limits:
        """What a query may take: time, rows, memory."""
        return Limits(self.timeout_s, self.max_rows, self.max_memory_bytes)
