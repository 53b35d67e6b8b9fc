"""Routing decisions: a request -> (model, replica, route, reason). Pure functions, no I/O.

- The **model router** (when the client asks for ``auto_model`` and a router is configured):
  hard requests (long prompt, high max_tokens, or a tenant rule) go to the large model, the
  rest to the small one; the reason says which rule decided. A client naming a served model
  is pinned to it.
- Among the healthy replicas of that model (or LoRA adapter: the replicas that list it):
  **round_robin**, **least_loaded** (fewest in-flight requests at the gateway; ties broken
  round-robin) or **affinity** (rendezvous hashing of the
  session id, else of the prompt prefix: the same key lands on the same replica while it is
  healthy, and only the keys of a replica that leaves move).
- Replicas come and go at runtime (``Router.add``/``remove``, the gateway's admin API): a
  **draining** replica finishes what it has and gets nothing new; one added starts unhealthy
  until its health probe passes.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from fleet.errors import FleetError
from fleet.gateway.config import GatewaySpec

__all__ = ["Decision", "NoReplica", "ReplicaState", "Router", "prefix_hash"]


class NoReplica(FleetError):
    """No healthy replica serves the model."""


@dataclass
class ReplicaState:
    name: str
    model: str
    url: str
    healthy: bool = True
    in_flight: int = 0
    adapters: tuple[str, ...] = ()  # LoRA adapters it serves, each asked for by its own name
    draining: bool = False  # on its way out: finishes its requests, gets no new one
    first_token_at: float | None = None  # epoch seconds of the first token it streamed through the gateway
    healthy_since: float | None = None  # epoch seconds it was last taken in (healthy); None while out

    def serves(self, model: str) -> bool:
        return model == self.model or model in self.adapters


@dataclass(frozen=True)
class Decision:
    model: str
    replica: ReplicaState
    route: str  # e.g. "model-router:large/least_loaded"
    reason: str  # e.g. "long prompt (1400 > 1024 tokens)"


def prefix_hash(prompt_key: str) -> int:
    return int.from_bytes(hashlib.blake2b(prompt_key.encode(), digest_size=8).digest(), "big")


def _score(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "big")


@dataclass
class Router:
    spec: GatewaySpec
    replicas: list[ReplicaState]
    _cycles: dict[str, itertools.count[int]] = field(default_factory=dict)

    def models(self) -> list[str]:
        return sorted({r.model for r in self.replicas} | {a for r in self.replicas for a in r.adapters})

    def choose_model(self, requested: str, tenant: str, prompt_tokens: int, max_tokens: int) -> tuple[str, str, str]:
        """(model, route prefix, reason)."""
        router = self.spec.model_router
        if requested == self.spec.auto_model or (router is None and requested not in self.models()):
            if router is None:
                raise NoReplica(f"model {requested!r} is not served (models: {', '.join(self.models())})")
            if tenant in router.large_tenants:
                return router.large_model, "model-router:large", f"tenant rule ({tenant})"
            if prompt_tokens > router.long_prompt_tokens:
                return (
                    router.large_model,
                    "model-router:large",
                    f"long prompt ({prompt_tokens} > {router.long_prompt_tokens} tokens)",
                )
            if max_tokens > router.high_max_tokens:
                return (
                    router.large_model,
                    "model-router:large",
                    f"high max_tokens ({max_tokens} > {router.high_max_tokens})",
                )
            return router.small_model, "model-router:small", "easy request"
        if requested not in self.models():
            raise NoReplica(f"model {requested!r} is not served (models: {', '.join(self.models())})")
        return requested, "pinned", "client named the model"

    def choose_replica(self, model: str, affinity_key: str) -> tuple[ReplicaState, str]:
        pool = [r for r in self.replicas if r.serves(model) and r.healthy and not r.draining]
        if not pool:
            raise NoReplica(f"no healthy replica serves {model!r}")
        policy = self.spec.policy
        if policy == "affinity":
            return max(pool, key=lambda r: _score(affinity_key, r.name)), policy
        turn = next(self._cycles.setdefault(model, itertools.count()))
        if policy == "round_robin":
            return pool[turn % len(pool)], policy
        fewest = min(r.in_flight for r in pool)
        candidates = [r for r in pool if r.in_flight == fewest]
        return candidates[turn % len(candidates)], policy

    def get(self, name: str) -> ReplicaState | None:
        return next((r for r in self.replicas if r.name == name), None)

    def add(self, replica: ReplicaState) -> None:
        """A replica joins (``ValueError`` when its name or URL is taken)."""
        for r in self.replicas:
            if r.name == replica.name or r.url == replica.url:
                raise ValueError(f"replica {replica.name!r} ({replica.url}) clashes with {r.name!r} ({r.url})")
        # a new list: a request choosing among the old one is not disturbed
        self.replicas = [*self.replicas, replica]

    def remove(self, name: str) -> ReplicaState:
        """A replica leaves (``KeyError`` when there is none by that name)."""
        replica = self.get(name)
        if replica is None:
            raise KeyError(name)
        self.replicas = [r for r in self.replicas if r.name != name]
        return replica

    def decide(self, requested: str, tenant: str, prompt_tokens: int, max_tokens: int, affinity_key: str) -> Decision:
        model, route, reason = self.choose_model(requested, tenant, prompt_tokens, max_tokens)
        replica, policy = self.choose_replica(model, affinity_key)
        return Decision(model, replica, f"{route}/{policy}", reason)
