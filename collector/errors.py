"""The collector's errors: one base, so that a caller can catch whatever the collector reports.

    CollectorError               anything the collector reports about what it was given
    ├── TargetError (ValueError)      a target definition cannot be used (collector.targets)
    ├── ExpositionError (ValueError)  malformed Prometheus exposition text, with its line (collector.exposition)
    ├── OtlpError (ValueError)        an OTLP body that cannot be decoded (collector.otlp)
    ├── MappingError (ValueError)     a record a request-log mapping matched but cannot make a row of
    │                                 (collector.mapping)
    └── RemoteWriteError (ValueError) a remote-write body the receiver refuses, with its HTTP status
                                      (collector.remote_write)

Each subclass is a ``ValueError`` too (what it reports is bad input), as callers catch it. A store that
cannot be written is ``storage.errors.StoreError``, not one of these.

In:  nothing.
Out: ``CollectorError``.
"""

from __future__ import annotations

__all__ = ["CollectorError"]


class CollectorError(Exception):
    """Base class for what the collector reports about its input."""
