"""`make demo` runs measured during the incident: does the alert evaluator skip a cycle, and how long
does the Overview page take to draw the first time it is opened?

In:  the project's `make demo` (real engines, the long-context-rollout scenario), Debian's Chromium.
Out: per run: the seconds from the traffic's start to the dashboard's Overview opened (inside the
     rollout, which starts at 180 s), its first render time (``scripts/screenshots.py``: from the
     navigation until the page is idle for good), the evaluator's skipped or missed cycles
     (APScheduler's warnings in the output) from the traffic's start until the run is stopped, and
     the process that ran each part; a table, and ``--json`` for the figures.

    .venv/bin/python scripts/demo_incident.py --runs 3 --json bench/results/demo_incident.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = re.compile(r"skipped: maximum number of running instances|was missed by")


def one_run(index: int, open_at_s: float, stop_at_s: float, shots: Path) -> dict[str, object]:
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "demo"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put((time.monotonic(), line)) for line in proc.stdout or []], daemon=True
    ).start()
    seen: list[tuple[float, str]] = []

    def until(pattern: str, timeout_s: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout_s
        for at, line in seen:
            if re.search(pattern, line):
                return at, line
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                at, line = lines.get(timeout=1)
            except queue.Empty:
                continue
            seen.append((at, line))
            if re.search(pattern, line):
                return at, line
        raise SystemExit(
            f"run {index}: no {pattern!r} in {timeout_s:g}s; output:\n" + "".join(x for _, x in seen[-60:])
        )

    def drain(until_s: float) -> None:
        while time.monotonic() < until_s:
            try:
                seen.append(lines.get(timeout=max(0.1, min(1.0, until_s - time.monotonic()))))
            except queue.Empty:
                continue

    try:
        _, announced = until(r"dashboard at (http://\S+)", 1800)
        url = re.search(r"dashboard at (http://\S+)", announced).group(1)  # type: ignore[union-attr]
        began, _ = until(r"^traffic: scenario", 900)
        drain(began + open_at_s)
        shot = subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "screenshots.py"),
                url,
                f"overview-{index}=/?range=15m",
                "--out",
                str(shots),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        render = re.search(r"\(([0-9.]+)s\)", shot.stdout)
        opened_s = time.monotonic() - began
        drain(began + stop_at_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        while not lines.empty():
            seen.append(lines.get())
    skipped = [line.strip() for at, line in seen if at >= began and SKIPPED.search(line)]
    pids = {k: re.search(rf"{k}.*process (\d+)", "".join(x for _, x in seen)) for k in ("alerts:", "dashboard at")}
    return {
        "run": index,
        "overview_opened_at_s": round(opened_s, 1),
        "overview_first_render_s": float(render.group(1)) if render else None,
        "screenshot_error": None if render else (shot.stdout + shot.stderr)[-400:],
        "evaluator_skipped_cycles": len(skipped),
        "skipped_lines": skipped[:10],
        "watched_s": round(stop_at_s, 0),
        "processes": {k.rstrip(":"): int(m.group(1)) if m else None for k, m in pids.items()} | {"up": proc.pid},
        "exit_code": proc.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--open-at", type=float, default=300.0, help="seconds after the traffic's start (rollout: 180)")
    parser.add_argument("--stop-at", type=float, default=480.0, help="seconds after the traffic's start")
    parser.add_argument("--shots", type=Path, default=ROOT / "tests" / "artifacts" / "demo-incident")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for i in range(1, args.runs + 1):
        print(f"run {i} of {args.runs} ...", flush=True)
        results.append(one_run(i, args.open_at, args.stop_at, args.shots))
        r = results[-1]
        print(
            f"  Overview opened {r['overview_opened_at_s']} s into the traffic: "
            f"first render {r['overview_first_render_s']} s; evaluator cycles skipped in {r['watched_s']:.0f} s: "
            f"{r['evaluator_skipped_cycles']}; processes {r['processes']}",
            flush=True,
        )
        if r["screenshot_error"]:
            print(f"  the screenshot failed: {r['screenshot_error']}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    worst = max((r["overview_first_render_s"] or 1e9) for r in results)  # type: ignore[type-var]
    print(f"worst first render {worst} s; skipped cycles {[r['evaluator_skipped_cycles'] for r in results]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
