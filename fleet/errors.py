"""The fleet package's errors: one base, ``FleetError``, that every error it raises on purpose
derives from; each message says what is wrong and what to do.

In:  nothing (raised by the fleet's modules).
Out: the hierarchy below. Callers that catch a subclass, or the builtin it also derives from
     (``ValueError``, ``RuntimeError``), keep catching what they caught before.

    FleetError(Exception)
    ├── LaunchError(FleetError, RuntimeError)      fleet.launcher: the fleet cannot be started or managed
    ├── GatewayError(FleetError, ValueError)       fleet.gateways: the spec cannot be served by that gateway
    ├── CalibrationError(FleetError)               fleet.calibrate: the engines could not be measured
    ├── EngineConfigError(FleetError, ValueError)  fleet.sim.engine: a simulator configuration that cannot run
    ├── RequestRejected(FleetError, ValueError)    fleet.sim.engine: a request the simulated engine refuses
    ├── NoReplica(FleetError)                      fleet.gateway.routing: no healthy replica for the model (503)
    └── Rejected(FleetError)                       fleet.gateway.admission: a tenant over its limits (429)

A bad fleet spec or scenario file is ``common.yamlfile.YamlConfigError`` (common's, shared with
fleetscope's own configuration), not a ``FleetError``.
"""

from __future__ import annotations

__all__ = ["FleetError", "LaunchError"]


class FleetError(Exception):
    """Base of every error the fleet package raises on purpose."""


class LaunchError(FleetError, RuntimeError):
    """The fleet cannot be started or managed; the message says why and what to do."""
