"""Who may open the dashboard: the ``dashboard`` section of ``fleetscope.yaml``.

In:  the section (``fleetscope.settings`` composes it).
Out: ``DashboardSettings`` (validated, frozen): the password or OIDC and its allow list.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from common.config import Section

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
    allowed_emails: list[str] = Field(
        default_factory=list,
        description="with oidc: the accounts let in, by address or by '@domain' "
        "(required: a provider accepts anyone it knows)",
    )

    @field_validator("password", mode="after")
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("the dashboard password must be at least 8 characters")
        return value

    @model_validator(mode="after")
    def _oidc_allow_list(self) -> DashboardSettings:
        if self.oidc and not self.allowed_emails:
            raise ValueError(
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

    @property
    def protected(self) -> bool:
        return self.password is not None or self.oidc
