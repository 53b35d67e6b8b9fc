"""Calibration glue for ``fleetscope up``: the real engines probed before the traffic starts.

In:  the fleet spec (its real vLLM engines, already started and warmed up), the scenario's name,
     the metadata DB's sessions, the SLO ledger (``fleetscope.slo_ledger``) and ``up``'s work
     directory.
Out: a ``Played`` (the rate scale measured by ``fleet.calibrate`` and the scenario to play: the
     shipped one, or a copy with a stronger rollout in ``work/scenario.yaml``), the calibrated
     SLO targets recorded (a person's stay), each step said in a line; or None (and a line saying
     why) when the calibration cannot tell: the scenario's own rate and the spec's targets then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fleetscope.slo_ledger import record_slos

if TYPE_CHECKING:
    from fleet.calibrate import Calibration
    from fleet.spec import FleetSpec

__all__ = ["JUDGED_MARGIN", "JUDGED_WINDOW_S", "Played", "calibrate_play"]

JUDGED_WINDOW_S = 300.0  # the built-in TTFT rules' window (TTFTOverSLO: latency_over_slo{window="5m"})
JUDGED_MARGIN = 1.25  # the calibrated rate gives the saturating pools this x the requests their p99 needs


@dataclass(frozen=True)
class Played:
    """What the traffic plays after a calibration: the rate scale, and the scenario (name or path)."""

    rate_scale: float
    scenario: str


def calibrate_play(
    spec: FleetSpec, scenario_name: str, sessions: Any, ledger: Path, work: Path, echo: Callable[[str], None]
) -> Played | None:
    """Calibrate on the spec's real engines, strengthen the rollout where the calibrated rate leaves
    it too weak, and record the calibrated SLO targets; None when the calibration cannot tell."""
    cal = _calibrate(spec, scenario_name, echo)
    if cal is None:
        return None
    played = _strengthened(spec, scenario_name, cal, work, echo) or scenario_name
    wanted = {(model, "ttft"): seconds for model, seconds in cal.slo_ttft_s.items()}
    recorded, kept = record_slos(sessions, wanted, ledger)
    if kept:
        echo(f"  SLO targets kept as set: {', '.join(kept)} (fleetscope slo set, or the Fleet page)")
    if recorded:
        echo(f"  SLO targets recorded: {', '.join(recorded)}")
    return Played(cal.rate_scale, played)


def _calibrate(spec: FleetSpec, scenario_name: str, echo: Callable[[str], None]) -> Calibration | None:
    """``fleet.calibrate`` on the spec's real engines with the scenario's first mix; None (and a
    line saying why) when it cannot tell: the scenario's own rate and the spec's targets then."""
    from alerts.read_slo import min_requests_for
    from fleet.calibrate import CalibrationError, calibrate
    from fleet.traffic import load_scenario

    pools: dict[str, list[str]] = {}
    for replica in spec.replicas:
        if replica.engine == "vllm":
            pools.setdefault(replica.model, []).append(spec.url(replica))
    try:
        # the pools the rollout saturates get requests enough for their p99 to be judged: the TTFT
        # rules' 5-minute window holding the 100 requests a p99 needs, a quarter to spare
        floor = JUDGED_MARGIN * min_requests_for(0.99) / JUDGED_WINDOW_S
        cal = calibrate(
            pools, load_scenario(scenario_name).mix, pool_floor_rps=floor, progress=lambda line: echo(f"  {line}")
        )
    except (CalibrationError, OSError) as exc:
        echo(f"  calibration failed ({exc}): playing the scenario's own rate, SLO targets from the spec")
        return None
    echo(cal.line())
    return cal


def _strengthened(
    spec: FleetSpec, scenario_name: str, cal: Calibration, work: Path, echo: Callable[[str], None]
) -> str | None:
    """Where the calibrated rate leaves the scenario's rollout too weak to saturate the small caches
    (``fleet.rollout.strengthen_rollout``), its stronger copy written to ``work/scenario.yaml`` (the
    path, and a line saying so); None: the scenario as shipped."""
    from fleet.rollout import strengthen_rollout
    from fleet.traffic import load_scenario

    replicas = Counter(r.model for r in spec.replicas if r.engine == "vllm")
    scenario, line = strengthen_rollout(load_scenario(scenario_name), cal, dict(replicas))
    if not line:
        return None
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    echo(f"  {line} (as played: {path})")
    return str(path)
