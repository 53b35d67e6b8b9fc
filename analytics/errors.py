"""What ``analytics`` raises when it cannot answer: one hierarchy, each error a sentence for a user.

In:  nothing.
Out: the error classes::

         AnalyticsError            every refusal of analytics; each is also the builtin its
         │                         callers catch (ValueError, KeyError), as before the hierarchy
         ├── BadInput              (ValueError) an argument outside what the function accepts
         │   │                     (``by``, ``agg``, a step, a quantile, a latency or field
         │   │                     name, a tier, filters a table cannot apply, token weights)
         │   └── BadWindow         a window that is empty or does not fit its counterpart
         ├── NoData                (ValueError) nothing in the window to compute this from
         │   │                     (no request-log rows, no tokens served)
         │   └── Unexplainable     an explanation that cannot be given for the view asked
         │                         (a tenant's cost without the gateway's request log)
         └── NoPrice               (KeyError) a replica that cannot be priced (no ``gpu_type``
                                   label, no price for its GPU): callers tell it apart

An error is an answer about the window asked, never cached as one by analytics itself.
"""

from __future__ import annotations

__all__ = ["AnalyticsError", "BadInput", "BadWindow", "NoData", "NoPrice", "Unexplainable"]


class AnalyticsError(Exception):
    """analytics cannot answer what was asked; the message says why."""


class BadInput(AnalyticsError, ValueError):
    """An argument outside what the function accepts."""


class BadWindow(BadInput):
    """A window that is empty (its end not after its start) or does not fit the other one."""


class NoData(AnalyticsError, ValueError):
    """Nothing in the window to compute this from."""


class Unexplainable(NoData):
    """An explanation that cannot be given for the view asked: what it needs was not recorded."""


class NoPrice(AnalyticsError, KeyError):
    """A replica without a GPU type, or a GPU type without a price: its spend is unknown."""
