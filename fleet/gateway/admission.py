"""Admission control: per-tenant token buckets and a bounded queue in front of the replicas.

In:  a tenant and the request's cost (1 request, prompt + max_tokens tokens).
Out: admitted (holding one of ``max_in_flight`` slots), or a ``Rejected`` with the HTTP status
     (429) and a ``Retry-After`` in seconds: over the tenant's request or token rate, or the
     queue of waiting requests is full, or the wait for a slot exceeded ``queue_timeout_s``.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from fleet.errors import FleetError
from fleet.gateway.config import GatewaySpec, TenantLimits

__all__ = ["Admission", "Rejected", "TokenBucket"]


class Rejected(FleetError):
    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = max(1, math.ceil(retry_after_s))


@dataclass
class TokenBucket:
    rate: float
    capacity: float
    level: float
    stamp: float

    @classmethod
    def full(cls, rate: float, burst_s: float) -> TokenBucket:
        capacity = max(1.0, rate * burst_s)
        return cls(rate, capacity, capacity, time.monotonic())

    def take(self, amount: float) -> float:
        """Take ``amount``; returns 0 when granted, else the seconds until it would be."""
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if amount > self.capacity:  # larger than a full bucket: admit only when full
            if self.level >= self.capacity:
                self.level -= amount
                return 0.0
            return (self.capacity - self.level) / self.rate
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


class Admission:
    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}
        self._slots = asyncio.Semaphore(spec.max_in_flight)
        self.waiting = 0

    def _limits(self, tenant: str) -> TenantLimits:
        return self.spec.tenant_limits.get(tenant, self.spec.default_limits)

    def check_rate(self, tenant: str, tokens: int) -> None:
        limits = self._limits(tenant)
        if limits.requests_per_s is not None:
            bucket = self._requests.setdefault(tenant, TokenBucket.full(limits.requests_per_s, limits.burst_s))
            wait = bucket.take(1)
            if wait:
                raise Rejected(f"tenant {tenant} over {limits.requests_per_s:g} requests/s", wait)
        if limits.tokens_per_s is not None:
            bucket = self._tokens.setdefault(tenant, TokenBucket.full(limits.tokens_per_s, limits.burst_s))
            wait = bucket.take(tokens)
            if wait:
                raise Rejected(f"tenant {tenant} over {limits.tokens_per_s:g} tokens/s", wait)

    async def acquire(self) -> None:
        """Wait for a forwarding slot in the bounded queue, or raise ``Rejected``."""
        if self._slots.locked():
            if self.waiting >= self.spec.max_queue:
                raise Rejected(f"gateway saturated: {self.waiting} requests already waiting", 1)
            self.waiting += 1
            try:
                await asyncio.wait_for(self._slots.acquire(), self.spec.queue_timeout_s)
            except TimeoutError:
                raise Rejected(f"no slot within {self.spec.queue_timeout_s:g}s", self.spec.queue_timeout_s) from None
            finally:
                self.waiting -= 1
            return
        await self._slots.acquire()

    def release(self) -> None:
        self._slots.release()
