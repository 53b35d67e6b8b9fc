"""``python -m fleet.autoscale --spec fleet.yaml --state data/fleet``: the live autoscaler of a
running fleet until SIGTERM (``fleet.autoscale.live``); one line per decision and per cold start
on stdout (``Launcher.start_autoscaler`` sends it to ``<state>/autoscaler.log``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import httpx

from common.yamlfile import YamlConfigError
from fleet.autoscale.live import run
from fleet.errors import FleetError
from fleet.spec import load_spec


async def _main(args: argparse.Namespace) -> None:
    spec = load_spec(args.spec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await run(
        spec,
        args.spec.resolve(),
        args.state,
        stop=stop,
        say=lambda line: print(line, flush=True),
        cpu_nice=args.cpu_nice,
        file_sd_wait_s=args.file_sd_wait_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, default=Path("fleet.yaml"))
    parser.add_argument("--state", type=Path, default=Path("data/fleet"), help="the launcher's state directory")
    parser.add_argument("--cpu-nice", type=int, default=0, help="CPU engines it starts run this much lower")
    parser.add_argument(
        "--file-sd-wait-s", type=float, default=12.0, help="after a replica leaves the targets file, before it stops"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per poll
    try:
        asyncio.run(_main(args))
    except (YamlConfigError, FleetError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
