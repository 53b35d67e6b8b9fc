"""The planner's errors: one base, ``PlannerError``, that every error it raises on purpose
derives from; each message is one line a user can act on.

In:  nothing (raised by the planner's modules).
Out: the hierarchy below. ``PlanError`` stays a ``ValueError`` so callers that catch either keep
     catching what they caught before.

    PlannerError(Exception)
    └── PlanError(PlannerError, ValueError)   planner.fleet: what cannot be planned (an unknown model
                                              or policy, no replica in the window, a KV budget that
                                              holds no block, ...)
"""

from __future__ import annotations

__all__ = ["PlannerError"]


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""
