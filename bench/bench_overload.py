"""Benchmark: the shipped ``overload`` scenario on the simulated fleet, with and without admission
by queue time, on the same machine and the same load (one seed).

Each run: the bundled spec (``fleet.yaml``) as a simulated fleet (``engine: sim``, free ports,
``--replicas``) behind fleetscope's gateway, its ``queue_time`` on or off; ``fleetscope fleet up
--detach``, ``fleetscope fleet traffic --scenario overload --log`` (open loop: every arrival
sent), ``fleetscope fleet down``. From the traffic's request log, per run: requests sent, shed
(429, by the reason the gateway gave), the admitted requests' p99 TTFT per model against its SLO
(``slo.ttft`` of the spec; streamed requests' TTFT, non-streamed ones' whole answer, an upper
bound of theirs) over the whole run and during the surge, throughput (answered requests per
second) and goodput (answered within the model's SLO per second). Not a test: nothing is asserted.

    .venv/bin/python bench/bench_overload.py --json bench/results/overload.json   # ~7 min
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "fleetscope"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def write_setup(tmp: Path, replicas: int, queue_time: bool) -> tuple[Path, dict[str, float]]:
    spec = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    base = spec["replicas"]
    made = []
    for i in range(replicas):
        r = dict(base[i % len(base)])
        if i >= len(base):
            r["name"] = f"{r['name'].rsplit('-', 1)[0]}-{i}"
        r.update(engine="sim", port=free_port())
        made.append(r)
    spec["replicas"] = made
    for model in spec["models"].values():
        model["path"] = str(tmp / "models" / Path(model["path"]).name)  # the simulator reads no weights
    spec.pop("otlp_traces_endpoint", None)
    spec.pop("autoscale", None)
    gateway = spec.setdefault("gateway", {})
    gateway.update(port=free_port(), request_log_url=None, queue_time={"enabled": queue_time})
    gateway.get("router_audit", {}).update(enabled=False)
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(spec))
    config = {"data_dir": str(tmp / "data"), "fleet": {"spec": str(tmp / "fleet.yaml")}}
    (tmp / "fleetscope.yaml").write_text(yaml.safe_dump(config))
    slo = {name: float(m["slo"]["ttft"]) for name, m in spec["models"].items() if "ttft" in m.get("slo", {})}
    return tmp / "fleetscope.yaml", slo


def run(tmp: Path, replicas: int, queue_time: bool, speed: float, seed: int, rate_scale: float) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    config, slo = write_setup(tmp, replicas, queue_time)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    fleet = [str(EXE), "fleet"]
    subprocess.run(
        [*fleet, "up", "--detach", "--config", str(config)], cwd=tmp, env=env, check=True, capture_output=True
    )
    log = tmp / "requests.jsonl"
    try:
        began = time.monotonic()
        done = subprocess.run(
            [*fleet, "traffic", "--scenario", "overload", "--speed", str(speed), "--seed", str(seed)]
            + ["--rate-scale", str(rate_scale)]
            + ["--log", str(log), "--config", str(config)],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.monotonic() - began
    finally:
        subprocess.run([*fleet, "down", "--config", str(config)], cwd=tmp, env=env, check=False, capture_output=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"traffic failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in log.read_text().splitlines() if line]
    return summarize(rows, slo, wall, queue_time) | {"summary_line": done.stdout.strip().splitlines()[-1:]}


def summarize(rows: list[dict[str, Any]], slo: dict[str, float], wall: float, queue_time: bool) -> dict[str, Any]:
    def first_token(r: dict[str, Any]) -> float:
        return float(r["ttft_s"] if r["ttft_s"] is not None else r["e2e_s"])

    answered = [r for r in rows if r["ok"]]
    shed = [r for r in rows if r["status"] == 429]
    models: dict[str, Any] = {}
    for model, target in sorted(slo.items()):
        mine = [r for r in answered if r["model"] == model]
        surge = [first_token(r) for r in mine if r["phase"] == "surge"]
        models[model] = {
            "slo_ttft_s": target,
            "answered": len(mine),
            "p99_ttft_s": p99([first_token(r) for r in mine]),
            "p99_ttft_surge_s": p99(surge),
            "within_slo": sum(first_token(r) <= target for r in mine),
        }
    good = sum(m["within_slo"] for m in models.values())
    return {
        "queue_time": queue_time,
        "wall_s": round(wall, 1),
        "sent": len(rows),
        "answered": len(answered),
        "shed": len(shed),
        "shed_share": len(shed) / len(rows) if rows else 0.0,
        "shed_reasons": dict(Counter(r["error"].removeprefix("http 429").strip() or "429" for r in shed)),
        "shed_by_tenant": dict(Counter(r["tenant"] for r in shed)),
        "other_failures": dict(Counter(r["error"] for r in rows if not r["ok"] and r["status"] != 429)),
        "throughput_per_s": len(answered) / wall,
        "goodput_per_s": good / wall,
        "models": models,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3, help="simulated replicas cycled from fleet.yaml's")
    parser.add_argument("--speed", type=float, default=4.0, help="the scenario's timeline speed-up (600 s / speed)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rate-scale", type=float, default=4.0, help="the scenario's rate times this (the simulator serves more)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in (False, True):
            name = "with queue-time admission" if mode else "without (fixed limits only)"
            print(
                f"== overload, {args.replicas} simulated replicas, speed x{args.speed:g}, rate x{args.rate_scale:g}: {name}",
                flush=True,
            )
            where = Path(tmp) / ("on" if mode else "off")
            r = results[name] = run(where, args.replicas, mode, args.speed, args.seed, args.rate_scale)
            print(
                f"  sent {r['sent']}, answered {r['answered']}, shed {r['shed']} ({r['shed_share']:.1%}: "
                f"{r['shed_reasons']}; by tenant {r['shed_by_tenant']}); other failures {r['other_failures']}"
            )
            print(f"  throughput {r['throughput_per_s']:.2f}/s, goodput (within SLO) {r['goodput_per_s']:.2f}/s")
            for model, m in r["models"].items():
                surge = m["p99_ttft_surge_s"]
                print(
                    f"  {model}: SLO {m['slo_ttft_s']:g}s; admitted p99 TTFT {m['p99_ttft_s']}s "
                    f"(surge {surge}s = {surge / m['slo_ttft_s']:.2f}x the SLO)"
                    if surge
                    else f"  {model}: no answers"
                )
    off, on = results["without (fixed limits only)"], results["with queue-time admission"]
    print(f"goodput with / without: {on['goodput_per_s'] / max(off['goodput_per_s'], 1e-9):.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=2)
        )


if __name__ == "__main__":
    main()
