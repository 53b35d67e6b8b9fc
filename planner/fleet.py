"""The fleet a replay runs: the recorded one read from the store, and variants of it.

In:  a client, a window (the replicas that reported in it: model, GPU type and count, KV cache
     from ``vllm:cache_config_info``), the gateway's routing policy as its request log recorded
     it, the model router's rules (``fleet.gateway.config.ModelRouterSpec``, from the fleet spec
     when one is given), the fitted engine cost (``planner.calibrate``); for a variant, the
     changes asked for (``--replicas tiny-small=4``, ``--gpu tiny-small=L4``, ...).
Out: ``Variant``: per model a ``Pool`` (replicas, GPU type and count, KV tokens per replica,
     engine config; for an autoscaled pool its ``ScalePolicy`` and cold start), the policy, the
     router, the gateway's admission limits and a traffic scale; ``PlanError`` with one line for
     what cannot be planned (an unknown model, a GPU type with no price or speed, a window with
     nothing recorded).

An autoscaled recording (the store's ``scale_events`` hold decisions for a pool before the
window's end) is replayed as it ran: the pool starts with the replicas it had at the window's
start (those that reported in the window, less those a scale-out made ready inside it), under
the policy the fleet spec gives it (``autoscale.pools``; the policy's defaults, widened to the
sizes the pool reached, where the spec has none), its new replicas ready after the median
cold start the store recorded (decision -> ``ready``; the policy's ``cold_start_s`` where none).

A GPU type's speed is relative to the others (``GPU_SPEED``, tokens per second as the list
prices go; ``--gpu-speed`` overrides): moving a pool from its recorded GPU type to another
scales its fitted engine speed by their ratio.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from analytics.cost import gpu_hours
from analytics.prefix import cache_capacity, cache_configs
from fleet.autoscale.policy import ScalePolicy
from fleet.gateway.config import ModelRouterSpec
from fleet.sim.engine import EngineConfig
from planner.errors import PlannerError
from storage.clickhouse import Client

__all__ = ["GPU_SPEED", "POLICIES", "PlanError", "Pool", "Variant", "gateway_routing", "observed_fleet"]

# relative serving throughput by GPU type (H100 = 1; the CPU demo fleet's own engines are their own unit)
GPU_SPEED = {"H200": 1.3, "H100": 1.0, "A100-80GB": 0.55, "A100": 0.5, "L40S": 0.35, "L4": 0.15, "cpu-demo": 1.0}
POLICIES = ("least_loaded", "round_robin", "affinity")
DEFAULT_BLOCK = 16


class PlanError(PlannerError, ValueError):
    """What cannot be planned, in one line."""


@dataclass(frozen=True)
class Pool:
    model: str
    replicas: int
    gpu_type: str
    gpu_count: int
    kv_tokens: int  # per replica
    engine: EngineConfig = field(default_factory=EngineConfig)
    names: tuple[str, ...] = ()  # the recorded replicas' names (a variant's extra ones are numbered)
    autoscale: ScalePolicy | None = None  # None: a fixed pool of ``replicas``; else it starts with them
    cold_start_s: float | None = None  # decision -> ready of a new replica (None: the policy's cold_start_s)
    observed_replicas: int = 0  # the recorded pool: every replica that reported in the window
    observed_cold_starts: int = 0  # and the scale-outs that became ready in it
    policy_source: str = ""  # where an autoscaled pool's policy came from (the fleet spec, or defaults)

    def cold_start(self) -> float:
        """How long a new replica takes to join: the recorded (or asked) cold start, else the policy's."""
        if self.cold_start_s is not None:
            return self.cold_start_s
        return self.autoscale.cold_start_s if self.autoscale is not None else 0.0

    def replica_names(self) -> list[str]:
        names = list(self.names[: self.replicas])
        n = 0
        while len(names) < self.replicas:
            candidate = f"{self.model}-plan-{n}"
            n += 1
            if candidate not in names:
                names.append(candidate)
        return names

    def engine_config(self) -> EngineConfig:
        blocks = max(2, self.kv_tokens // self.engine.block_size + 1)  # + vLLM's null block
        return replace(
            self.engine,
            num_blocks=blocks,
            max_model_len=min(self.engine.max_model_len, (blocks - 1) * self.engine.block_size),
        )


@dataclass(frozen=True)
class Variant:
    name: str
    pools: dict[str, Pool]
    policy: str = "least_loaded"
    router: ModelRouterSpec | None = None
    max_in_flight: int = 64
    max_queue: int = 128
    queue_timeout_s: float = 30.0
    scale: float = 1.0
    shared_cores: float | None = None  # engines on one host's CPU cores (the CPU demo fleet); None: each its own GPU
    ttft_slo: Mapping[str, float] = field(default_factory=dict)  # model -> p99 TTFT target (autoscaling's signal)
    scale_interval_s: float = 5.0  # how often the autoscaler reads its signals (the spec's autoscale.interval_s)

    def describe(self) -> str:
        pools = ", ".join(
            f"{p.model} {_size(p)} {p.gpu_type}"
            + (f"x{p.gpu_count}" if p.gpu_count != 1 else "")
            + f" ({p.kv_tokens:,} KV tokens)"
            for p in self.pools.values()
        )
        return f"{pools}; {self.policy}" + (f"; traffic x{self.scale:g}" if self.scale != 1 else "")

    def replica_count(self) -> int:
        return sum(p.replicas for p in self.pools.values())

    def with_pool(self, model: str, **changes: object) -> Variant:
        """The pool of ``model`` changed; a replica count without a policy makes it a fixed pool of that many."""
        if model not in self.pools:
            raise PlanError(f"unknown model {model!r}: the recorded fleet serves {', '.join(sorted(self.pools))}")
        if "replicas" in changes and "autoscale" not in changes:
            changes["autoscale"] = None
        return replace(self, pools={**self.pools, model: replace(self.pools[model], **changes)})  # type: ignore[arg-type]


def _size(pool: Pool) -> str:
    if pool.autoscale is None:
        return f"{pool.replicas}x"
    return f"{pool.autoscale.min_replicas}..{pool.autoscale.max_replicas}x (autoscaled, from {pool.replicas})"


def observed_fleet(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    policy: str = "least_loaded",
    router: ModelRouterSpec | None = None,
    engines: dict[str, EngineConfig] | None = None,
    policies: Mapping[str, ScalePolicy] | None = None,
) -> Variant:
    """The recorded fleet: every replica that reported in ``[start, end)``, pooled by model; a pool
    the store saw scale replayed as it ran (see the module docstring; ``policies``: the fleet
    spec's, by model)."""
    hours = gpu_hours(client, start, end)  # the replicas up in the window, with their GPU labels
    rows = list(hours[["replica", "model", "gpu_type", "gpu_count"]].itertuples(index=False, name=None))
    if not rows:
        raise PlanError(f"no replica reported between {start:%Y-%m-%d %H:%M} and {end:%H:%M} UTC: nothing to replay")
    configs = cache_configs(client)  # one read: the blocks and their size
    kv = cache_capacity(client, configs)
    sizes = {replica: size for replica, (_blocks, size) in configs.items()}
    pools: dict[str, Pool] = {}
    for name, served, gpu_type, gpu_count in rows:
        model, replica = str(served), str(name)
        if model in pools:
            pool = pools[model]
            pools[model] = replace(pool, replicas=pool.replicas + 1, names=(*pool.names, replica))
            continue
        base = (engines or {}).get(model, EngineConfig())
        block = sizes.get(replica, base.block_size)
        tokens = int(kv.get(replica, (base.num_blocks - 1) * block))
        pools[model] = Pool(
            model,
            1,
            str(gpu_type) or "unknown",
            max(1, int(gpu_count)),
            tokens,
            # the longest request its cache holds (the metrics do not say its max_model_len; vLLM starts with
            # none longer than the cache, and the recorded requests were served)
            replace(base, block_size=block, max_model_len=max(block, tokens)),
            (replica,),
        )
    pools = {m: replace(p, observed_replicas=p.replicas) for m, p in pools.items()}
    for model, facts in _scaling(client, start, end).items():
        if model in pools:
            pools[model] = _autoscaled(pools[model], facts, (policies or {}).get(model))
    return Variant("recorded", pools, policy=policy, router=router)


SCALE_LOOKBACK = timedelta(days=1)  # a pool whose last decision is older than this replays as a fixed one


@dataclass(frozen=True)
class _Scaled:
    joined: frozenset[str]  # replicas a scale-out made ready inside the window
    cold_starts: tuple[float, ...]  # decision -> ready, seconds, of every scale-out the store holds
    largest: int  # the largest size a decision asked for
    reached: int  # the largest size a scale-out that became ready in the window asked for


def _scaling(client: Client, start: datetime, end: datetime) -> dict[str, _Scaled]:
    """Per pool the store's scale events up to ``end`` (a day back): who joined in the window, the cold starts."""
    result = client.query(
        "SELECT d.pool, r.replica, toFloat64(r.ts), toFloat64(d.ts), d.to_replicas FROM scale_events AS d "
        "LEFT JOIN (SELECT decision_id, replica, ts FROM scale_events WHERE kind = 'ready') AS r "
        "ON r.decision_id = d.decision_id "
        "WHERE d.kind IN ('scale_out', 'scale_in', 'held_at_max', 'flap_guard') "
        "AND d.ts >= {s:DateTime64(3)} AND d.ts < {e:DateTime64(3)}",
        parameters={
            "s": (start - SCALE_LOOKBACK).astimezone(UTC).replace(tzinfo=None),
            "e": end.astimezone(UTC).replace(tzinfo=None),
        },
    )
    t0, t1 = start.timestamp(), end.timestamp()
    found: dict[str, tuple[set[str], list[float], list[int]]] = {}
    for pool, replica, ready, decided, size in result.result_rows:
        joined, colds, sizes = found.setdefault(str(pool), (set(), [], [0, 0]))
        sizes[0] = max(sizes[0], int(size))
        if replica and ready and ready > 0:  # a decision with no ready step yet: the LEFT JOIN's defaults
            colds.append(float(ready) - float(decided))
            if t0 < float(ready) < t1:
                joined.add(str(replica))
                sizes[1] = max(sizes[1], int(size))
    return {pool: _Scaled(frozenset(j), tuple(c), n[0], n[1]) for pool, (j, c, n) in found.items()}


def _autoscaled(pool: Pool, facts: _Scaled, policy: ScalePolicy | None) -> Pool:
    """``pool`` as the autoscaler ran it: its size at the window's start, its policy and cold start."""
    at_start = [n for n in pool.names if n not in facts.joined] or list(pool.names[:1])
    source = "the fleet spec"
    if policy is None:
        source = "the policy's defaults (the fleet spec has none for this pool)"
        policy = ScalePolicy(max_replicas=max(3, facts.largest, pool.replicas))
    return replace(
        pool,
        replicas=len(at_start),
        names=(*at_start, *[n for n in pool.names if n not in at_start]),
        autoscale=policy,
        cold_start_s=statistics.median(facts.cold_starts) if facts.cold_starts else None,
        observed_replicas=max(len(at_start), facts.reached),
        observed_cold_starts=len(facts.joined),
        policy_source=source,
    )


def gateway_routing(spec_path: str | Path | None) -> tuple[ModelRouterSpec | None, int]:
    """The fleet spec's model router and the tokens its gateway hashes for a prefix (``None`` and
    the gateway's default where there is no spec, or it has no gateway: requests keep the model
    they were served by)."""
    from common.yamlfile import YamlConfigError
    from fleet.gateway.config import GatewaySpec
    from fleet.spec import load_spec

    default = GatewaySpec().affinity_prefix_tokens
    if spec_path is None:
        return None, default
    try:
        spec = load_spec(Path(spec_path))
    except (YamlConfigError, OSError):
        return None, default
    if spec.gateway is None:
        return None, default
    return spec.gateway.model_router, spec.gateway.affinity_prefix_tokens


def gpu_speed(gpu_type: str, speeds: dict[str, float]) -> float:
    if gpu_type not in speeds:
        raise PlanError(
            f"unknown GPU type {gpu_type!r}: give its speed relative to the others with --gpu-speed {gpu_type}=0.5 "
            f"(known: {', '.join(sorted(speeds))})"
        )
    return speeds[gpu_type]
