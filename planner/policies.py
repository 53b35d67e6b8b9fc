"""Autoscaling policies to replay: the one the recording ran and the ones asked for, side by side.

In:  ``--autoscale POOL=TOKENS`` texts (``tiny-large=min:1,max:3,out.kv_cache_usage:0.7,
     out_for:15,cooldown:60``; ``parse``), the fleet spec the recorded run used (its ``autoscale``
     section: each pool's ``ScalePolicy`` and the evaluation interval; ``spec_policies``), the
     recorded fleet (``planner.fleet.observed_fleet``) and the SLO targets.
Out: ``Autoscale`` (what ``planner.plan.plan`` takes); ``for_scaling``: the recorded fleet with
     the TTFT targets and interval its autoscaler reads; ``policy_variants``: one variant per
     policy asked for, named by it (``tiny-large autoscaled min:1,max:3,...``); ``comparison``:
     per autoscaled pool and fleet, spend per hour, p99 TTFT, SLO attainment, the most replicas
     up at once and the cold starts; ``PlanError`` naming a bad token or a policy that cannot be.

A policy asked for starts from the pool's recorded policy (the fleet spec's) or, for a pool that
did not autoscale, from ``ScalePolicy``'s defaults; each token changes one setting:

    min:N  max:N                       min_replicas, max_replicas
    out.SIGNAL:X  in.SIGNAL:X          a threshold (``off`` drops the signal); signals:
                                       kv_cache_usage, requests_waiting, requests_running,
                                       ttft_p99_over_slo
    out_for:S  in_for:S                how long a signal must hold (seconds)
    cooldown:S  in_cooldown:S          after a scale-out before the next; after any before a scale-in
    cold_start:S                       a new replica's start-up (default: the recorded median)
    drain_timeout:S  flap_window:S  max_reversals:N
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from fleet.autoscale.policy import SIGNALS, ScalePolicy
from planner.fleet import PlanError, Variant
from storage.catalog import SloTarget

__all__ = ["Asked", "Autoscale", "comparison", "for_scaling", "parse", "policy_variants", "spec_policies"]

FIELDS = {  # token -> ScalePolicy field
    "min": "min_replicas",
    "max": "max_replicas",
    "out_for": "out_for_s",
    "in_for": "in_for_s",
    "cooldown": "out_cooldown_s",
    "in_cooldown": "in_cooldown_s",
    "cold_start": "cold_start_s",
    "drain_timeout": "drain_timeout_s",
    "flap_window": "flap_window_s",
    "max_reversals": "max_reversals",
}
WHOLE = {"min_replicas", "max_replicas", "max_reversals"}
RECORDED = ("recorded (observed)", "recorded (replayed)")


@dataclass(frozen=True)
class Asked:
    """One policy asked for: its pool, the text it was asked with, the settings it changes."""

    pool: str
    text: str
    settings: Mapping[str, float] = field(default_factory=dict)  # ScalePolicy field -> value
    out: Mapping[str, float | None] = field(default_factory=dict)  # signal -> threshold (None: dropped)
    in_: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.pool} autoscaled {self.text}"

    def policy(self, base: ScalePolicy | None) -> ScalePolicy:
        start = base or ScalePolicy()
        out = {s: t for s, t in {**start.out, **self.out}.items() if t is not None}
        in_ = {s: t for s, t in {**start.in_, **self.in_}.items() if t is not None}
        data: dict[str, Any] = {**start.model_dump(by_alias=True), **self.settings, "out": out, "in": in_}
        try:
            return ScalePolicy.model_validate(data)
        except ValidationError as exc:
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise PlanError(f"--autoscale {self.pool}={self.text}: {why}") from None


@dataclass(frozen=True)
class Autoscale:
    """What ``plan`` replays of autoscaling: the recorded policies (the fleet spec's) and the asked ones."""

    asked: tuple[Asked, ...] = ()
    recorded: Mapping[str, ScalePolicy] = field(default_factory=dict)
    interval_s: float = 5.0
    ttft_slo: Mapping[str, float] = field(default_factory=dict)  # the spec's models' slo.ttft (the autoscaler's)


def parse(text: str) -> Asked:
    """``POOL=key:value,...`` -> ``Asked`` (``PlanError`` naming the token that is wrong)."""
    pool, sep, rest = text.partition("=")
    if not sep or not pool.strip() or not rest.strip():
        raise PlanError(
            f"--autoscale {text!r}: write POOL=TOKEN,..., e.g. tiny-large=min:1,max:3,out.kv_cache_usage:0.7"
        )
    settings: dict[str, float] = {}
    thresholds: dict[str, dict[str, float | None]] = {"out": {}, "in": {}}
    for token in (t.strip() for t in rest.split(",")):
        key, colon, value = token.partition(":")
        bad = f"--autoscale {pool.strip()}: {token!r}"
        if not colon or not key or not value:
            raise PlanError(f"{bad} is not KEY:VALUE (e.g. max:3, out.requests_waiting:2)")
        side, dot, signal = key.partition(".")
        if dot and side in thresholds:
            if signal not in SIGNALS:
                raise PlanError(f"{bad}: unknown signal {signal!r}; the signals are {', '.join(SIGNALS)}")
            thresholds[side][signal] = None if value == "off" else _number(value, bad)
        elif key in FIELDS:
            settings[FIELDS[key]] = _number(value, bad, whole=FIELDS[key] in WHOLE)
        else:
            known = ", ".join([*FIELDS, "out.SIGNAL", "in.SIGNAL"])
            raise PlanError(f"{bad}: unknown setting {key!r}; the settings are {known}")
    return Asked(pool.strip(), rest.strip(), settings, thresholds["out"], thresholds["in"])


def _number(value: str, bad: str, *, whole: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        raise PlanError(f"{bad}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0 or (whole and number != int(number)):
        raise PlanError(f"{bad}: {value!r} must be a {'whole ' if whole else ''}number of 0 or more")
    return int(number) if whole else number


def spec_policies(spec_path: str | Path | None, asked: Iterable[Asked] = ()) -> Autoscale:
    """What the fleet spec the recorded run used says of autoscaling: each pool's policy, the
    evaluation interval, the models' TTFT SLOs (nothing without a spec; a spec that does not load
    says so), with the policies ``asked`` for."""
    from common.yamlfile import YamlConfigError
    from fleet.spec import load_spec

    if spec_path is None:
        return Autoscale(tuple(asked))
    try:
        spec = load_spec(Path(spec_path))
    except (YamlConfigError, OSError) as exc:
        raise PlanError(f"the fleet spec {spec_path}: {exc}") from None
    slo = {m: float(c.slo["ttft"]) for m, c in spec.models.items() if c.slo.get("ttft")}
    if spec.autoscale is None:
        return Autoscale(tuple(asked), ttft_slo=slo)
    return Autoscale(tuple(asked), dict(spec.autoscale.pools), spec.autoscale.interval_s, slo)


def for_scaling(base: Variant, autoscale: Autoscale | None, targets: Iterable[SloTarget]) -> Variant:
    """``base`` with what an autoscaler reads: the models' TTFT targets (the spec's, else the SLO
    targets') and the evaluation interval."""
    slo = {t.model: t.threshold_seconds for t in targets if t.metric == "ttft"}
    if autoscale is None:
        return replace(base, ttft_slo=slo)
    return replace(base, ttft_slo={**slo, **autoscale.ttft_slo}, scale_interval_s=autoscale.interval_s)


def recorded(autoscale: Autoscale | None) -> Mapping[str, ScalePolicy] | None:
    return autoscale.recorded if autoscale else None


def policy_variants(base: Variant, autoscale: Autoscale | None) -> list[Variant]:
    """One variant of ``base`` per policy asked for: the pool autoscaled by it from its size at the window's start."""
    out = []
    for asked in autoscale.asked if autoscale else ():
        if asked.pool not in base.pools:
            raise PlanError(
                f"--autoscale: unknown model {asked.pool!r}; the recorded fleet serves {', '.join(sorted(base.pools))}"
            )
        pool = base.pools[asked.pool]
        policy = asked.policy(pool.autoscale)
        size = min(max(pool.replicas, policy.min_replicas), policy.max_replicas)
        cold = policy.cold_start_s if "cold_start_s" in asked.settings else pool.cold_start_s
        v = base.with_pool(asked.pool, replicas=size, autoscale=policy, cold_start_s=cold)
        out.append(replace(v, name=asked.name))
    return out


def comparison(planned: Any, autoscale: Autoscale | None) -> pd.DataFrame:
    """Per autoscaled pool, the recorded fleet (observed, replayed) and each policy asked for:
    ``[fleet, pool, policy, spend_per_hour, p99_ttft, slo_attainment, max_replicas, cold_starts,
    fleet_spend_per_hour]`` (empty where nothing autoscaled and nothing was asked)."""
    fleets: Mapping[str, Variant] = planned.fleets
    names = [*RECORDED, *(a.name for a in (autoscale.asked if autoscale else ()))]
    pools = sorted({m for v in fleets.values() for m, p in v.pools.items() if p.autoscale is not None})
    rows = []
    for name in [n for n in names if n in planned.summaries]:
        s = planned.summaries[name].set_index("model")
        fleet = fleets.get(name, fleets.get(RECORDED[1]))
        for model in pools:
            pool = fleet.pools.get(model) if fleet is not None else None
            if pool is None or model not in s.index:
                continue
            observed = name == RECORDED[0]
            rows.append(
                {
                    "fleet": name,
                    "pool": model,
                    "policy": _describe(pool.autoscale) if pool.autoscale else f"fixed {pool.replicas}",
                    "spend_per_hour": float(s.loc[model, "spend_per_hour"]),
                    "p99_ttft": float(s.loc[model, "p99_ttft"]),
                    "slo_attainment": float(s.loc[model, "slo_attainment"]),
                    "max_replicas": pool.observed_replicas if observed else int(s.loc[model, "max_replicas"]),
                    "cold_starts": pool.observed_cold_starts if observed else int(s.loc[model, "cold_starts"]),
                    "fleet_spend_per_hour": float(s.loc["(fleet)", "spend_per_hour"]),
                }
            )
    return pd.DataFrame(rows, columns=[*_COMPARED])


_COMPARED = (
    "fleet",
    "pool",
    "policy",
    "spend_per_hour",
    "p99_ttft",
    "slo_attainment",
    "max_replicas",
    "cold_starts",
    "fleet_spend_per_hour",
)


def _describe(p: ScalePolicy) -> str:
    """``1..3, out kv_cache_usage>0.8|requests_waiting>2 for 15s, cooldown 60s``."""
    out = "|".join(f"{s}>{t:g}" for s, t in p.out.items())
    return f"{p.min_replicas}..{p.max_replicas}, out {out} for {p.out_for_s:g}s, cooldown {p.out_cooldown_s:g}s"
