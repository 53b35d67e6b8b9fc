"""What ``exporter`` raises: one hierarchy, each error a sentence for a user.

In:  nothing.
Out: the error classes::

         ExporterError             every error the exporter defines
         ├── ReadFailed            (RuntimeError) a figure could not be read this refresh: the
         │                         store away, a GPU type without a price, no metadata DB. Not
         │                         raised to the scraper: the refresher counts it
         │                         (``fleetscope_exporter_refresh_errors_total{figure}``), logs
         │                         it once and keeps the figure's last good values
         └── BadSample             (ValueError) a sample whose labels are not its family's
                                   (a reader's mistake: refused before it reaches /metrics)

Invalid settings are refused by ``exporter.config``'s validators with ``ValueError`` (pydantic
turns them into the one-line ``ConfigError``), not with classes of their own.
"""

from __future__ import annotations

__all__ = ["BadSample", "ExporterError", "ReadFailed"]


class ExporterError(Exception):
    """The base of every error the exporter defines."""


class ReadFailed(ExporterError, RuntimeError):
    """A figure could not be read from analytics this refresh; the message names it and why."""


class BadSample(ExporterError, ValueError):
    """A sample whose labels are not the ones its family declares."""
