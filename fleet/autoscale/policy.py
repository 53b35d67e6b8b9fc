"""The autoscaler's decisions: a pool's LLM signals over time -> scale out, scale in, or hold.

In:  a pool's ``ScalePolicy`` (thresholds, how long a signal must hold, cooldowns, min/max, the
     flapping guard), its ``PoolState`` (replicas ready, starting, draining; the decision history)
     and, every evaluation, its ``signals``: the mean over its ready replicas of
     ``kv_cache_usage`` (0-1), ``requests_waiting`` and ``requests_running`` per replica, and
     ``ttft_p99_over_slo`` (the pool's p99 TTFT over its SLO target; above 1 is over).
Out: ``decide`` -> a ``Decision`` (or None): ``scale_out`` / ``scale_in`` (from -> to replicas),
     or a hold worth recording (``held_at_max``, ``flap_guard``), with the signal, its value, the
     threshold and when the signal first crossed it. Pure: no clock, no I/O; the caller (the live
     autoscaler, the simulator, the planner) applies a decision with ``PoolState.record``.

Rules, in order:
1. Fewer replicas than ``min_replicas`` (ready + starting): out to the minimum; more than
   ``max_replicas``: in.
2. **Out** when any out signal has been above its threshold for ``out_for_s`` (the one furthest
   over names the decision), no replica of the pool is still starting (its cold start has not
   ended: another now would pile up), and ``out_cooldown_s`` has passed since the last scale-out.
   At ``max_replicas`` it is ``held_at_max`` instead, once per episode.
3. **In** when every in signal has been below its threshold for ``in_for_s``, nothing is starting
   or draining, and ``in_cooldown_s`` has passed since the last scale event of either direction
   and since a replica last became ready (a replica that paid its cold start gets to serve).
   A scale-in that would make the pool change direction ``max_reversals`` times or more within
   ``flap_window_s`` is refused (``flap_guard``, once per episode): the pool stays larger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["SIGNALS", "Decision", "PoolState", "ScalePolicy", "decide"]

SIGNALS: tuple[str, ...] = ("kv_cache_usage", "requests_waiting", "requests_running", "ttft_p99_over_slo")
Kind = Literal["scale_out", "scale_in", "held_at_max", "flap_guard"]


class ScalePolicy(BaseModel):
    """One pool's policy (``autoscale.pools.<model>`` in the fleet spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=3, ge=1)
    out: dict[str, float] = Field(
        default_factory=lambda: {"kv_cache_usage": 0.8, "requests_waiting": 2.0},
        description="scale out when any of these (mean per ready replica) stays above its threshold",
    )
    in_: dict[str, float] = Field(
        default_factory=lambda: {"kv_cache_usage": 0.3, "requests_waiting": 0.1},
        alias="in",
        description="scale in when all of these stay below their thresholds",
    )
    out_for_s: float = Field(default=15.0, ge=0, description="how long an out signal must hold")
    in_for_s: float = Field(default=120.0, ge=0, description="how long the in signals must hold")
    out_cooldown_s: float = Field(default=60.0, ge=0, description="after a scale-out, before the next one")
    in_cooldown_s: float = Field(
        default=180.0, ge=0, description="after any scale event or a replica becoming ready, before a scale-in"
    )
    flap_window_s: float = Field(default=900.0, gt=0)
    max_reversals: int = Field(default=2, ge=1, description="direction changes within flap_window_s before holding")
    drain_timeout_s: float = Field(default=120.0, gt=0, description="the longest a scale-in waits for requests")
    cold_start_s: float = Field(default=40.0, ge=0, description="the simulator's start-up time of a new replica")

    @field_validator("out", "in_")
    @classmethod
    def _signals(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(SIGNALS))
        if unknown:
            raise ValueError(f"unknown signal {unknown[0]!r}: the signals are {', '.join(SIGNALS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ScalePolicy:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        if not self.out:
            raise ValueError("out: name at least one signal and its threshold")
        for signal, low in self.in_.items():
            high = self.out.get(signal)
            if high is not None and low >= high:
                raise ValueError(f"in.{signal} ({low:g}) must be below out.{signal} ({high:g}), or the pool flaps")
        return self


@dataclass(frozen=True)
class Decision:
    pool: str
    kind: Kind
    from_replicas: int
    to_replicas: int
    signal: str
    value: float
    threshold: float
    crossed_at: float | None  # when the signal first crossed (seconds, the caller's clock)
    reason: str


@dataclass
class PoolState:
    """What the autoscaler knows of one pool between evaluations."""

    ready: int
    starting: int = 0
    draining: int = 0
    out_since: dict[str, float] = field(default_factory=dict)  # signal -> first time above its out threshold
    in_since: float | None = None  # first time every in signal was below its threshold
    last_out_at: float = float("-inf")
    last_in_at: float = float("-inf")
    last_ready_at: float = float("-inf")  # when a replica last became ready (``count``, ``became_ready``)
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, "out" | "in")
    held: str | None = None  # the hold already recorded in this episode

    @property
    def size(self) -> int:
        """Replicas that serve or will: ready and starting (draining ones are on their way out)."""
        return self.ready + self.starting

    def count(self, ready: int, starting: int, draining: int, now: float) -> None:
        """The pool's replicas as counted now (the live autoscaler counts them each evaluation)."""
        if ready > self.ready:
            self.last_ready_at = now
        self.ready, self.starting, self.draining = ready, starting, draining

    def became_ready(self, now: float) -> None:
        """A starting replica is ready (healthy, serving)."""
        self.starting -= 1
        self.ready += 1
        self.last_ready_at = now

    def record(self, decision: Decision, now: float) -> None:
        """Apply a decision's timing (the caller changes ``ready``/``starting``/``draining``)."""
        if decision.kind == "scale_out":
            self.last_out_at = now
            self.history.append((now, "out"))
            self.held = None
        elif decision.kind == "scale_in":
            self.last_in_at = now
            self.history.append((now, "in"))
            self.in_since = None
            self.held = None
        else:
            self.held = decision.kind

    def reversals(self, now: float, window_s: float) -> int:
        recent = [d for t, d in self.history if now - t <= window_s]
        return sum(1 for a, b in zip(recent, recent[1:], strict=False) if a != b)


def _track(policy: ScalePolicy, state: PoolState, signals: dict[str, float], now: float) -> None:
    for signal, threshold in policy.out.items():
        value = signals.get(signal)
        if value is not None and value > threshold:
            state.out_since.setdefault(signal, now)
        else:
            state.out_since.pop(signal, None)
    below = all(signals.get(s) is not None and signals[s] < t for s, t in policy.in_.items())
    if below and not state.out_since:
        state.in_since = state.in_since if state.in_since is not None else now
    else:
        state.in_since = None
    if not state.out_since and state.held == "held_at_max":
        state.held = None  # the episode is over: a next one is recorded again


def decide(pool: str, policy: ScalePolicy, state: PoolState, signals: dict[str, float], now: float) -> Decision | None:
    """The decision for one evaluation (see the module's rules), or None to do nothing."""
    _track(policy, state, signals, now)
    size = state.size
    if size < policy.min_replicas:
        return Decision(pool, "scale_out", size, policy.min_replicas, "min_replicas", size, policy.min_replicas, None,
                        f"{size} replicas, below min_replicas {policy.min_replicas}")  # fmt: skip
    if size > policy.max_replicas:
        return Decision(pool, "scale_in", size, policy.max_replicas, "max_replicas", size, policy.max_replicas, None,
                        f"{size} replicas, above max_replicas {policy.max_replicas}")  # fmt: skip
    due = [s for s, since in state.out_since.items() if now - since >= policy.out_for_s]
    if due:
        out = policy.out
        return _out(pool, policy, state, signals, max(due, key=lambda s: signals[s] / out[s]), now)
    if state.in_since is not None and now - state.in_since >= policy.in_for_s:
        return _in(pool, policy, state, signals, now)
    return None


def _words(signal: str, value: float, op: str, threshold: float, since: float | None, now: float) -> str:
    held = f" for {now - since:.0f}s" if since is not None else ""
    return f"{signal} {value:.3g} {op} {threshold:g}{held}"


def _out(
    pool: str, policy: ScalePolicy, state: PoolState, signals: dict[str, float], signal: str, now: float
) -> Decision | None:
    value, threshold, since = signals[signal], policy.out[signal], state.out_since[signal]
    why = _words(signal, value, ">", threshold, since, now)
    if state.size >= policy.max_replicas:
        if state.held == "held_at_max":
            return None
        return Decision(pool, "held_at_max", state.size, state.size, signal, value, threshold, since,
                        f"{why}, but the pool is at max_replicas {policy.max_replicas}")  # fmt: skip
    if state.starting or now - state.last_out_at < policy.out_cooldown_s:
        return None
    return Decision(pool, "scale_out", state.size, state.size + 1, signal, value, threshold, since, why)


def _in(pool: str, policy: ScalePolicy, state: PoolState, signals: dict[str, float], now: float) -> Decision | None:
    if state.size <= policy.min_replicas or state.starting or state.draining:
        return None
    if now - max(state.last_out_at, state.last_in_at, state.last_ready_at) < policy.in_cooldown_s:
        return None
    signal = next(iter(policy.in_))
    value, threshold = signals[signal], policy.in_[signal]
    why = _words(signal, value, "<", threshold, state.in_since, now)
    last = state.history[-1][1] if state.history else None
    changes = state.reversals(now, policy.flap_window_s) + (last == "out")
    if last == "out" and changes >= policy.max_reversals:
        if state.held == "flap_guard":
            return None
        return Decision(pool, "flap_guard", state.size, state.size, signal, value, threshold, state.in_since,
                        f"{why}, but scaling in now would be change of direction {changes} within "
                        f"{policy.flap_window_s:g}s (max_reversals {policy.max_reversals}): holding")  # fmt: skip
    return Decision(pool, "scale_in", state.size, state.size - 1, signal, value, threshold, state.in_since, why)
