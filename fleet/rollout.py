"""The demo's incident, made to be one: a rollout phase strong enough for the calibrated rate.

In:  a ``Scenario``, its ``fleet.calibrate.Calibration`` (the rate played, and per pool whose KV cache
     holds one long-context request the time one took alone) and the replicas per model pool.
Out: ``rollout_load`` -> per such pool, how busy a phase's long requests alone keep each replica;
     ``strengthen_rollout`` -> the scenario with each phase that raises the long-context share
     raised further where even the busiest such pool would stay under ``ROLLOUT_LOAD`` (at most
     ``MAX_ROLLOUT_SHARE``), and a line saying so ("" when nothing changed). The rate follows the
     steady mix; how hard the rollout hits the small caches did not.
"""

from __future__ import annotations

from fleet.calibrate import Calibration, pool_shares
from fleet.traffic import Scenario, TrafficMix

__all__ = ["MAX_ROLLOUT_SHARE", "ROLLOUT_LOAD", "rollout_load", "strengthen_rollout"]

# a phase that raises the long-context share is the demo's incident: its long requests alone keep the replicas of a
# pool whose cache holds one at least this busy (by the time one takes alone; with the cores shared they take longer).
# Runs whose rollouts reached 30-35 % paged 1.5-3 minutes in with p99s of 9-15 s; one at 21 % paged weakly (4.8 s)
# after a burst had already crossed its target; one raised to 45 % from 28 % reached 76 s, every request waiting.
# Where it would fall short the phase's share is raised, up to MAX_ROLLOUT_SHARE
ROLLOUT_LOAD = 0.3
MAX_ROLLOUT_SHARE = 0.8


def rollout_load(cal: Calibration, mix: TrafficMix, share: float, replicas: dict[str, int]) -> dict[str, float]:
    """Per pool whose cache holds one long-context request (``cal.queue_wait_s``): how busy a phase
    with ``share`` long-context requests keeps each of its ``replicas`` with those alone, at the
    calibrated rate (requests/s to the pool x ``share`` x the time one took alone / replicas)."""
    shares = pool_shares(mix)
    return {
        m: cal.planned_rps * shares[m] * share * wait / max(replicas.get(m, 1), 1)
        for m, wait in cal.queue_wait_s.items()
        if m in shares
    }


def strengthen_rollout(
    scenario: Scenario, cal: Calibration, replicas: dict[str, int], *, load: float = ROLLOUT_LOAD
) -> tuple[Scenario, str]:
    """``scenario`` with each phase that raises the long-context share raised further, where at the
    calibrated rate its long requests would keep even the busiest cache-limited pool's replicas less
    than ``load`` busy (``rollout_load``), to that (at most ``MAX_ROLLOUT_SHARE``; a share already
    there is left), and a line saying so. The load is sized on the base mix's rate and pool shares
    (a phase that also changes those is taken as if it did not);
    the scenario itself and "" when every such phase is strong enough (or there is none). The rate
    follows the steady mix; how hard the rollout then hits the small caches did not: on a fast day
    a demo's rollout kept them 21 % busy and its page came late and weak (p99 4.8 s, where runs at
    30-35 % reached 9-15 s)."""
    base = scenario.mix.long_context_share
    phases, said = [], []
    for phase in scenario.phases:
        share = phase.set.get("long_context_share")
        if not isinstance(share, int | float) or share <= base:
            phases.append(phase)
            continue
        busy = rollout_load(cal, scenario.mix, float(share), replicas)
        if not busy or max(busy.values()) >= load or share >= MAX_ROLLOUT_SHARE or min(busy.values()) <= 0:
            phases.append(phase)
            continue
        pool = max(busy, key=lambda m: busy[m])
        raised = min(MAX_ROLLOUT_SHARE, float(share) * load / busy[pool])
        phases.append(phase.model_copy(update={"set": {**phase.set, "long_context_share": round(raised, 3)}}))
        reached = busy[pool] * raised / float(share)
        said.append(
            f"{phase.name}: long-context share {float(share):.0%} -> {raised:.0%}, so that its long requests keep "
            f"each {pool} replica {reached:.0%} busy (at {float(share):.0%}: {busy[pool]:.0%}; one took "
            f"{cal.queue_wait_s[pool]:.2g}s alone)"
            + (f", the most this allows (wanted {load:.0%})" if reached < load * 0.999 else "")
        )
    if not said:
        return scenario, ""
    return scenario.model_copy(update={"phases": phases}), "rollout strengthened: " + "; ".join(said)
