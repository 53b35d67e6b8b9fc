"""Who may open the dashboard, and how it reads: the ``dashboard`` section of ``fleetscope.yaml``.

In:  the section (``fleetscope.settings`` composes it).
Out: ``DashboardSettings`` (validated, frozen): the password or OIDC and its allow list, and how
     many ClickHouse clients a page reads its panels on at once.
"""

from __future__ import annotations

import os

from pydantic import Field, SecretStr, field_validator, model_validator

from common.config import Section
from dashboard.errors import DashboardConfigError

__all__ = ["DashboardSettings"]


class DashboardSettings(Section):
    """Who may open the dashboard. On a loopback address nobody is asked; on any other address
    ``fleetscope dashboard`` refuses to start unless one of these is set."""

    password: SecretStr | None = Field(
        default=None, description="asked once per browser session (set it through FLEETSCOPE_DASHBOARD_PASSWORD)"
    )
    oidc: bool = Field(
        default=False,
        description="log in with Streamlit's OIDC (st.login; the provider in .streamlit/secrets.toml [auth])",
    )
    readers: int | None = Field(
        default=None,
        ge=0,
        le=8,
        description="ClickHouse clients a page reads its panels on at once (0 or 1: one after another); "
        "default: the machine's cores less one, at most 3 (the browser on the same 2-core machine as the "
        "server gains nothing from more)",
    )
    max_grain_s: int = Field(
        default=600,
        ge=10,
        le=3600,
        description="the longest a relative time range waits before it moves (answers are cached until it "
        "does): 10 s up to 12 hours, a day 20 s, a week 140 s, 30 days this",
    )
    allowed_emails: list[str] = Field(
        default_factory=list,
        description="with oidc: the accounts let in, by address or by '@domain' "
        "(required: a provider accepts anyone it knows)",
    )

    @field_validator("password", mode="after")
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise DashboardConfigError("the dashboard password must be at least 8 characters")
        return value

    @model_validator(mode="after")
    def _oidc_allow_list(self) -> DashboardSettings:
        if self.oidc and not self.allowed_emails:
            raise DashboardConfigError(
                "oidc needs allowed_emails (addresses, or '@example.com' for a domain): "
                "the provider lets in anyone who has an account with it"
            )
        return self

    def allows(self, email: str | None) -> bool:
        email = (email or "").strip().lower()
        if "@" not in email:
            return False
        wanted = {e.strip().lower() for e in self.allowed_emails}
        return email in wanted or email[email.index("@") :] in wanted

    def reader_count(self) -> int:
        """How many reader clients the dashboard opens (``readers``, or the default)."""
        if self.readers is not None:
            return self.readers
        return max(0, min(3, (os.cpu_count() or 1) - 1))

    @property
    def protected(self) -> bool:
        return self.password is not None or self.oidc
