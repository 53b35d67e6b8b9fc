"""Ad-hoc SQL's errors: one base, so that a caller can catch whatever ``adhoc`` reports.

    AdhocError                   anything ad-hoc SQL reports to the person who wrote the query
    ├── Refused (ValueError)     the statement check refuses the query; it is not run (adhoc.guard)
    └── QueryFailed (RuntimeError)  ClickHouse refused or failed the query (adhoc.runner)

``Refused`` stays a ``ValueError`` and ``QueryFailed`` a ``RuntimeError``, as callers catch them. A store
that cannot be reached is ``storage.errors.StoreError``, not one of these.

In:  nothing.
Out: ``AdhocError``.
"""

from __future__ import annotations

__all__ = ["AdhocError"]


class AdhocError(Exception):
    """Base class for what ad-hoc SQL reports."""
