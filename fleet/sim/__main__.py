"""Run simulated vLLM engines: ``python -m fleet.sim --spec fleet.yaml`` (its ``engine: sim``
replicas), ``python -m fleet.sim --replicas 500 --base-port 9000`` (N generated ones), or
``python -m fleet.sim --spec fleet.yaml --replica-json '{...}' --cold-start-s 40`` (one replica
that is not in the spec, e.g. one the autoscaler adds; it binds its port only after the
modelled cold start, as a real engine does once its weights are loaded)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.yamlfile import YamlConfigError
from fleet.sim.server import SimFleet, SimReplica, engine_config

if TYPE_CHECKING:
    from fleet.spec import FleetSpec


def refusing(spec: FleetSpec, adapters: list[str]) -> tuple[str, ...]:
    """The adapters of ``adapters`` whose answers refuse (``answers: refuse`` in the spec)."""
    return tuple(a for a in adapters if a in spec.adapters and spec.adapters[a].answers == "refuse")


def replicas_from_args(args: argparse.Namespace) -> tuple[list[SimReplica], str | None, str]:
    if args.replicas:
        config = engine_config({"num_gpu_blocks_override": args.blocks, "max_model_len": args.max_model_len})
        reps = [
            SimReplica(f"sim-{i}", args.model, args.base_port + i, config, gpu_type=args.gpu_type)
            for i in range(args.replicas)
        ]
        return reps, args.otlp_endpoint, args.host
    from fleet.spec import ReplicaSpec, load_spec

    spec = load_spec(args.spec)
    if args.replica_json:
        try:
            one = ReplicaSpec.model_validate_json(args.replica_json)
        except ValueError as exc:
            raise YamlConfigError(f"--replica-json: not a replica: {exc}") from None
        config = engine_config(one.engine_args, one.speculative, one.max_loras if one.adapters else 0)
        replica = SimReplica(
            one.name,
            one.model,
            one.port,
            config,
            one.gpu_type,
            one.gpu_count,
            tuple(one.adapters),
            refusing=refusing(spec, one.adapters),
        )
        return [replica], args.otlp_endpoint or spec.otlp_traces_endpoint, spec.host
    reps = [
        SimReplica(
            r.name,
            r.model,
            r.port,
            engine_config(r.engine_args, r.speculative, r.max_loras if r.adapters else 0),
            r.gpu_type,
            r.gpu_count,
            adapters=tuple(r.adapters),
            refusing=refusing(spec, r.adapters),
        )
        for r in spec.replicas
        if r.engine == "sim"
    ]
    if not reps:
        raise YamlConfigError(f"{args.spec}: no replica has engine: sim")
    return reps, args.otlp_endpoint or spec.otlp_traces_endpoint, spec.host


async def run(args: argparse.Namespace) -> None:
    replicas, otlp, host = replicas_from_args(args)
    fleet = SimFleet(replicas, host=host, otlp_endpoint=otlp, cold_start_s=args.cold_start_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(fleet.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped during its cold start
        starting.cancel()
        return
    starting.result()
    print(f"{len(replicas)} simulated engine(s) on {host}:{replicas[0].port}..{replicas[-1].port}", flush=True)
    await stopping
    await fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, default=Path("fleet.yaml"))
    parser.add_argument("--replicas", type=int, default=0, help="generate N replicas instead of reading the spec")
    parser.add_argument("--base-port", type=int, default=9000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="sim-model")
    parser.add_argument("--gpu-type", default="H100")
    parser.add_argument("--blocks", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--otlp-endpoint", default=None)
    parser.add_argument("--replica-json", default=None, help="run this one replica (a spec replica as JSON)")
    parser.add_argument("--cold-start-s", type=float, default=0.0, help="seconds before the ports are bound")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run(args))
    except (YamlConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
