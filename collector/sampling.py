"""Request sampling: a request row -> keep it (with a weight) or not.

In:  a request row (tenant, model, trace id, status, latencies) and a ``SamplingPolicy``.
Out: the row's ``weight`` (1 / keep probability) or None when it is not kept.

Policy: errors (status >= 400) and requests slower than the thresholds are always kept with
weight 1 (tail keep); every other request is kept with the head rate of the first matching
rule (tenant and/or model), else the default rate, and then weighs 1 / rate, so sums of
``weight`` estimate totals without bias.

One decision per request: the first row of a trace to arrive (the gateway's or the engine's)
decides, with what it knows (only the gateway row knows the tenant; each side measures its own
latencies), and the decision and weight are remembered by trace id for the other row
(``decision_ttl`` entries, oldest forgotten first). Both rows are then kept or dropped together
with the same weight, so joined counts stay unbiased: whichever rate was used, the row weighs
its inverse. The keep draw hashes the trace id, so it is the same on every collector.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SamplingPolicy", "SamplingRule", "Sampler"]


class SamplingRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str | None = None
    model: str | None = None
    rate: float = Field(gt=0, le=1)


class SamplingPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default_rate: float = Field(default=1.0, gt=0, le=1)
    rules: list[SamplingRule] = Field(default_factory=list)
    keep_errors: bool = True
    keep_ttft_above_s: float | None = Field(default=2.0, gt=0)
    keep_e2e_above_s: float | None = Field(default=30.0, gt=0)


def _unit(trace_id: str) -> float:
    digest = hashlib.blake2b(trace_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Sampler:
    def __init__(self, policy: SamplingPolicy, remember: int = 200_000) -> None:
        self.policy = policy
        self._decisions: OrderedDict[str, float | None] = OrderedDict()
        self._remember = remember

    @property
    def keeps_everything(self) -> bool:
        """Every row is kept with weight 1 (no rate below 1): no decision to make or remember."""
        return self.policy.default_rate >= 1.0 and all(rule.rate >= 1.0 for rule in self.policy.rules)

    def rate_for(self, tenant: str, model: str) -> float:
        for rule in self.policy.rules:
            if (rule.tenant is None or rule.tenant == tenant) and (rule.model is None or rule.model == model):
                if rule.tenant is not None and not tenant:
                    continue
                return rule.rate
        return self.policy.default_rate

    def weight(self, row: dict[str, Any]) -> float | None:
        """The row's weight, or None when it is dropped; the same for both rows of a trace."""
        key = str(row.get("trace_id") or "")
        if key and key in self._decisions:
            return self._decisions[key]
        decision = self._decide(row)
        if key:
            self._decisions[key] = decision
            if len(self._decisions) > self._remember:
                self._decisions.popitem(last=False)
        return decision

    def _decide(self, row: dict[str, Any]) -> float | None:
        p = self.policy
        if p.keep_errors and int(row.get("status_code") or 0) >= 400:
            return 1.0
        if p.keep_ttft_above_s is not None and float(row.get("ttft_seconds") or 0) > p.keep_ttft_above_s:
            return 1.0
        if p.keep_e2e_above_s is not None and float(row.get("e2e_seconds") or 0) > p.keep_e2e_above_s:
            return 1.0
        rate = self.rate_for(str(row.get("tenant") or ""), str(row.get("model") or ""))
        if rate >= 1.0:
            return 1.0
        return 1.0 / rate if _unit(str(row.get("trace_id") or row.get("request_id") or "")) < rate else None
