"""The dashboard's own errors: one base. The pages show what other packages raise (``adhoc``'s
``AdhocError``, ``storage``'s ``StoreError``, ``planner``'s ``PlanError``) and raise nothing of their own.

    DashboardError                           anything the dashboard itself reports
    └── DashboardConfigError (ValueError)    a ``dashboard`` setting that cannot work (a short password,
                                             oidc without allowed_emails); pydantic reports it as the
                                             setting's validation error

In:  nothing.
Out: ``DashboardError``, ``DashboardConfigError``.
"""

from __future__ import annotations

__all__ = ["DashboardConfigError", "DashboardError"]


class DashboardError(Exception):
    """Base class for what the dashboard itself reports."""


class DashboardConfigError(DashboardError, ValueError):
    """A dashboard setting that cannot work; a ``ValueError``, as pydantic's validators raise."""
