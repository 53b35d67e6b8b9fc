"""The fleet a replay runs: the recorded one read from the store, and variants of it.

In:  a client, a window (the replicas that reported in it: model, GPU type and count, KV cache
     from ``vllm:cache_config_info``), the gateway's routing policy as its request log recorded
     it, the model router's rules (``fleet.gateway.config.ModelRouterSpec``, from the fleet spec
     when one is given), the fitted engine cost (``planner.calibrate``); for a variant, the
     changes asked for (``--replicas tiny-small=4``, ``--gpu tiny-small=L4``, ...).
Out: ``Variant``: per model a ``Pool`` (replicas, GPU type and count, KV tokens per replica,
     engine config), the policy, the router, the gateway's admission limits and a traffic scale;
     ``PlanError`` with one line for what cannot be planned (an unknown model, a GPU type with no
     price or speed, a window with nothing recorded).

A GPU type's speed is relative to the others (``GPU_SPEED``, tokens per second as the list
prices go; ``--gpu-speed`` overrides): moving a pool from its recorded GPU type to another
scales its fitted engine speed by their ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from analytics.cost import gpu_hours
from analytics.prefix import cache_capacity, cache_configs
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

    def describe(self) -> str:
        pools = ", ".join(
            f"{p.model} {p.replicas}x {p.gpu_type}"
            + (f"x{p.gpu_count}" if p.gpu_count != 1 else "")
            + f" ({p.kv_tokens:,} KV tokens)"
            for p in self.pools.values()
        )
        return f"{pools}; {self.policy}" + (f"; traffic x{self.scale:g}" if self.scale != 1 else "")

    def replica_count(self) -> int:
        return sum(p.replicas for p in self.pools.values())

    def with_pool(self, model: str, **changes: object) -> Variant:
        if model not in self.pools:
            raise PlanError(f"unknown model {model!r}: the recorded fleet serves {', '.join(sorted(self.pools))}")
        return replace(self, pools={**self.pools, model: replace(self.pools[model], **changes)})  # type: ignore[arg-type]


def observed_fleet(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    policy: str = "least_loaded",
    router: ModelRouterSpec | None = None,
    engines: dict[str, EngineConfig] | None = None,
) -> Variant:
    """The recorded fleet: every replica that reported in ``[start, end)``, pooled by model."""
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
    return Variant("recorded", pools, policy=policy, router=router)


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
