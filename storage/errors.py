"""Errors raised by fleetscope's stores.

    StoreError                 anything the stores report to a user
    ├── StoreUnavailable       the store cannot be reached or opened (server down, chDB
    │                          directory held by another process, bad credentials)
    └── MigrationError         a schema migration cannot be applied
        └── ChecksumMismatch   an applied migration file was edited afterwards

Messages are written for the person at the terminal: what failed, where, and what to do.
"""

from __future__ import annotations

__all__ = ["ChecksumMismatch", "MigrationError", "StoreError", "StoreUnavailable"]


class StoreError(Exception):
    """Base class for store problems shown to the user."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or opened."""


class MigrationError(StoreError):
    """A schema migration cannot be applied."""


class ChecksumMismatch(MigrationError):
    """An already-applied migration file no longer matches what was applied."""
