"""Admission by queue time: a request that would wait past its pool's budget is refused at once.

In:  per pool (the model a request was routed to): the requests forwarded and still waiting for
     their first token (``ahead``), the times of the pool's recent first tokens (its pace), and its
     budget (the model's SLO TTFT target × ``budget_factor``); per request its tenant, the
     tenant's ``weight`` (its fair share) and ``priority``.
Out: ``QueueTime.decide(pool, tenant)`` -> ``Verdict``: admitted, or shed with a reason
     (``queue_time``: the estimated wait is past the budget; ``tenant_share``: the pool is
     past ``fair_share_at`` of its budget and this tenant holds more than its share of what
     waits) and a ``Retry-After`` (the seconds until the excess would have drained);
     ``sent`` / ``first_token`` / ``done`` keep the pool's state as requests go.

The estimate: the pool serves its waiting requests at the pace it gave first tokens while it had
some waiting, over the last ``window_s`` (first tokens ÷ the seconds with requests waiting: a
quiet pool's pace is its service rate, not its demand), so one more waits about
(ahead + 1) / pace. With fewer than ``min_events``
first tokens in the window (a quiet or new pool) there is no estimate and the request is
admitted: the fixed limits (``max_in_flight``, ``max_queue``) stay the outer bound. Priority
widens the budget by half of it per step (priority 2: twice the budget), a negative one narrows
it the same way; a tenant with priority above 0 is not shed for its share.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Pool", "QueueTime", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reason: str = ""  # "queue_time" or "tenant_share" when shed
    message: str = ""
    estimated_wait_s: float | None = None
    retry_after_s: int = 0


@dataclass
class Pool:
    budget_s: float | None  # None: this pool is not admitted by queue time
    ahead: int = 0
    ahead_by_tenant: dict[str, int] = field(default_factory=dict)
    # each first token: (when, the seconds the pool had requests waiting since the one before)
    first_tokens: deque[tuple[float, float]] = field(default_factory=deque)
    busy_s: float = 0.0  # seconds with requests waiting since the last first token
    changed_at: float = 0.0  # when ``ahead`` last changed

    def move(self, now: float, by: int) -> None:
        """``ahead`` changes by ``by``: the time it had requests waiting is counted first."""
        if self.ahead > 0:
            self.busy_s += max(0.0, now - self.changed_at)
        self.changed_at = now
        self.ahead = max(0, self.ahead + by)

    def pace(self, now: float, window_s: float) -> tuple[float, int]:
        """(first tokens per busy second over the window, how many it counted)."""
        events = self.first_tokens
        while events and events[0][0] < now - window_s:
            events.popleft()
        busy = sum(seconds for _at, seconds in events)
        if not events or busy <= 0:
            return 0.0, len(events)
        return len(events) / busy, len(events)


class QueueTime:
    def __init__(
        self,
        budgets: dict[str, float],
        *,
        budget_factor: float = 1.0,
        window_s: float = 30.0,
        min_events: int = 5,
        fair_share_at: float = 0.5,
        weights: dict[str, float] | None = None,
        priorities: dict[str, int] | None = None,
        default_weight: float = 1.0,
        default_priority: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budgets = {pool: seconds * budget_factor for pool, seconds in budgets.items()}
        self.window_s, self.min_events, self.fair_share_at = window_s, min_events, fair_share_at
        self.weights, self.priorities = weights or {}, priorities or {}
        self.default_weight, self.default_priority = default_weight, default_priority
        self.clock = clock
        self.pools: dict[str, Pool] = {}

    def pool(self, name: str) -> Pool:
        found = self.pools.get(name)
        if found is None:
            found = self.pools[name] = Pool(self.budgets.get(name))
        return found

    def estimated_wait(self, name: str) -> float | None:
        """Seconds a request sent now to the pool would wait for its first token; None: no estimate."""
        pool = self.pool(name)
        pace, events = pool.pace(self.clock(), self.window_s)
        if events < self.min_events or pace <= 0:
            return None
        return (pool.ahead + 1) / pace

    def budget(self, name: str, tenant: str) -> float | None:
        base = self.pool(name).budget_s
        if base is None:
            return None
        priority = self.priorities.get(tenant, self.default_priority)
        return base * (1 + 0.5 * priority) if priority >= 0 else base / (1 + 0.5 * -priority)

    def decide(self, name: str, tenant: str) -> Verdict:
        budget = self.budget(name, tenant)
        wait = self.estimated_wait(name) if budget is not None else None
        if budget is None or wait is None:
            return Verdict(True, estimated_wait_s=wait)
        if wait > budget:
            return Verdict(
                False,
                "queue_time",
                f"{name} would queue ~{wait:.1f}s, past its {budget:.1f}s budget",
                wait,
                max(1, math.ceil(wait - budget)),
            )
        if (
            wait > self.fair_share_at * budget
            and self.priorities.get(tenant, self.default_priority) <= 0
            and self._over_share(name, tenant)
        ):
            pool = self.pool(name)
            return Verdict(
                False,
                "tenant_share",
                f"{name} is busy (~{wait:.1f}s to queue) and tenant {tenant} holds "
                f"{pool.ahead_by_tenant.get(tenant, 0)} of its {pool.ahead} waiting requests, over its share",
                wait,
                max(1, math.ceil(wait - self.fair_share_at * budget)),
            )
        return Verdict(True, estimated_wait_s=wait)

    def _over_share(self, name: str, tenant: str) -> bool:
        """Whether ``tenant`` holds at least its weighted share of the pool's waiting requests (the
        tenants that have some, and it); one more of its requests would take it past."""
        pool = self.pool(name)
        holding = pool.ahead_by_tenant.get(tenant, 0)
        if holding == 0:
            return False
        active = {t for t, n in pool.ahead_by_tenant.items() if n > 0} | {tenant}
        total_weight = sum(self.weights.get(t, self.default_weight) for t in active)
        share = self.weights.get(tenant, self.default_weight) / total_weight
        return holding + 1 > share * (pool.ahead + 1)

    def sent(self, name: str, tenant: str) -> None:
        """A request admitted and forwarded to the pool: it waits for its first token."""
        pool = self.pool(name)
        pool.move(self.clock(), +1)
        pool.ahead_by_tenant[tenant] = pool.ahead_by_tenant.get(tenant, 0) + 1

    def first_token(self, name: str, tenant: str) -> None:
        """Its first token came (or the whole answer, not streamed): it no longer waits."""
        pool, now = self.pool(name), self.clock()
        if pool.ahead_by_tenant.get(tenant, 0) <= 0:
            return  # not one of the waiting (a second call for the same request)
        self._leave(pool, tenant, now)
        pool.first_tokens.append((now, pool.busy_s))
        pool.busy_s = 0.0

    def done(self, name: str, tenant: str, *, waited: bool) -> None:
        """It ended; ``waited``: without a first token (an error, a timeout, the client gone)."""
        if waited:
            pool = self.pool(name)
            if pool.ahead_by_tenant.get(tenant, 0) > 0:
                self._leave(pool, tenant, self.clock())

    @staticmethod
    def _leave(pool: Pool, tenant: str, now: float) -> None:
        pool.move(now, -1)
        left = pool.ahead_by_tenant.get(tenant, 0) - 1
        if left > 0:
            pool.ahead_by_tenant[tenant] = left
        else:
            pool.ahead_by_tenant.pop(tenant, None)
