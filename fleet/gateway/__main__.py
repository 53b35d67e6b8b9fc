"""``python -m fleet.gateway --spec fleet.yaml``: run the gateway of a fleet spec until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from common.yamlfile import YamlConfigError
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.spec import load_spec


async def _main(spec_path: Path) -> None:
    spec = load_spec(spec_path)
    if spec.gateway is None:
        raise YamlConfigError(f"{spec_path}: no gateway section")
    replicas = [ReplicaState(r.name, r.model, spec.url(r), adapters=tuple(r.adapters)) for r in spec.replicas]
    targets = {name: model.slo["ttft"] for name, model in spec.models.items() if "ttft" in model.slo}
    gateway = Gateway(spec.gateway, replicas, budgets=targets)
    await gateway.start(spec.host, spec.gateway.port)
    print(
        f"gateway on http://{spec.host}:{spec.gateway.port} ({spec.gateway.policy}"
        f"{', model router' if spec.gateway.model_router else ''}) in front of {len(replicas)} replica(s)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, default=Path("fleet.yaml"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_main(args.spec))
    except YamlConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
