"""fleetscope's own errors (the wiring layer): one base, so that a caller can catch whatever it reports.

    FleetscopeError                                   anything the wiring reports on purpose
    ├── UpError                                       ``fleetscope up`` cannot start (fleetscope.up)
    └── EndpointUnavailable (RuntimeError)            a running process's query endpoint did not
                                                      answer, or not as one (fleetscope.queryapi)

``EndpointUnavailable`` stays a ``RuntimeError``, as callers catch it. A bad configuration is
``fleetscope.settings.SettingsError`` (``common.config.ConfigError``, shared with every
component's section); the errors of the packages fleetscope wires stay theirs
(``storage.errors.StoreError``, ``fleet.errors.FleetError``, ``adhoc.errors.AdhocError``, ...).
``fleet_cli._Terminate`` is no error: SIGTERM turned into an exception, to stop the foreground fleet.

In:  nothing (raised by fleetscope's modules).
Out: the hierarchy above.
"""

from __future__ import annotations

__all__ = ["EndpointUnavailable", "FleetscopeError", "UpError"]


class FleetscopeError(Exception):
    """Base of every error fleetscope's wiring raises on purpose."""


class UpError(FleetscopeError):
    """``fleetscope up`` cannot start: the reason, in words."""


class EndpointUnavailable(FleetscopeError, RuntimeError):
    """The running process's query endpoint did not answer (or not as one)."""
