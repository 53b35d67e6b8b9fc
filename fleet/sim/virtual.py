"""Simulated engines in virtual time: traffic in, ``/metrics`` expositions at scrape instants out.

In:  replicas (name, model, ``EngineConfig``), a start time and duration (epoch seconds), the
     scrape interval, a request rate (requests/s per replica, a function of time), a request
     shape, optional restarts (replica -> seconds after start) and a seed.
Out: ``run`` yields ``Scrape(replica, model, ts, text)`` in time order per replica: exactly
     what the collector would have scraped, produced as fast as the CPU allows instead of in
     real time. Requests finished are yielded too (``finished``) for request-log rows.

The engine is the same ``SimEngine`` the live simulator serves; only the clock differs.
A restart replaces the engine and its exposition: counters start from zero, as after a real
engine restart.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fleet.sim.engine import EngineConfig, SimEngine, SimRequest
from fleet.sim.metrics import Exposition

__all__ = ["RequestShape", "Scrape", "VirtualReplica", "run"]


@dataclass(frozen=True)
class RequestShape:
    """Prompt and output lengths: lognormal around a median, clipped to the model length."""

    prompt_median: int = 400
    prompt_sigma: float = 0.8
    output_median: int = 24
    output_sigma: float = 0.5
    shared_prefix: int = 64  # tokens of a system prompt most requests share (prefix caching)
    shared_share: float = 0.6


@dataclass
class VirtualReplica:
    name: str
    model: str
    config: EngineConfig = field(default_factory=EngineConfig)


@dataclass(frozen=True)
class Scrape:
    replica: str
    model: str
    ts: float
    text: str
    finished: tuple[SimRequest, ...] = ()


def _request(rng: random.Random, shape: RequestShape, config: EngineConfig, arrival: float, n: int) -> SimRequest:
    limit = config.max_model_len
    output = max(1, min(int(rng.lognormvariate(math.log(shape.output_median), shape.output_sigma)), limit // 4))
    prompt_len = max(1, min(int(rng.lognormvariate(math.log(shape.prompt_median), shape.prompt_sigma)), limit - output))
    prefix = list(range(shape.shared_prefix)) if rng.random() < shape.shared_share else []
    body = [rng.randrange(1000, 30000) for _ in range(max(0, prompt_len - len(prefix)))]
    prompt = (prefix + body)[:prompt_len]
    return SimRequest(request_id=f"v-{n}", prompt=prompt, max_tokens=output, arrival=arrival)


def _replica(
    replica: VirtualReplica,
    start: float,
    duration_s: float,
    interval_s: float,
    rate: Callable[[float], float],
    shape: RequestShape,
    restart_at: float | None,
    rng: random.Random,
) -> Iterator[Scrape]:
    engine = SimEngine(replica.config)
    exposition = Exposition(engine, replica.model, started=start)
    now = start
    end = start + duration_s
    next_arrival = start + rng.expovariate(max(rate(start), 1e-9))
    restart = start + restart_at if restart_at is not None else math.inf
    finished: list[SimRequest] = []
    n = 0
    scrape_at = start
    while scrape_at < end:
        while now < scrape_at:
            if now >= restart:  # the engine dies: in-flight work is lost, counters restart
                engine = SimEngine(replica.config)
                exposition = Exposition(engine, replica.model, started=now)
                restart = math.inf
            while next_arrival <= now:
                n += 1
                engine.submit(_request(rng, shape, replica.config, next_arrival, n))
                r = rate(next_arrival)
                next_arrival += rng.expovariate(r) if r > 0 else interval_s
            if engine.has_work():
                duration, _produced, done = engine.step(now)
                finished.extend(done)
                now += max(duration, 1e-6)
            else:
                now = min(next_arrival, scrape_at, restart)
        yield Scrape(replica.name, replica.model, scrape_at, exposition.render(), tuple(finished))
        finished = []
        scrape_at += interval_s


def run(
    replicas: list[VirtualReplica],
    start: float,
    duration_s: float,
    *,
    interval_s: float = 5.0,
    rate: float | Callable[[float], float] = 0.5,
    shape: RequestShape | None = None,
    restarts: dict[str, float] | None = None,
    seed: int = 0,
) -> Iterator[Scrape]:
    """Every scrape of every replica over ``[start, start + duration_s)``, replica by replica."""
    rate_fn = rate if callable(rate) else (lambda _t, r=float(rate): r)
    shape = shape or RequestShape()
    for index, replica in enumerate(replicas):
        rng = random.Random(seed * 1_000_003 + index)
        yield from _replica(
            replica, start, duration_s, interval_s, rate_fn, shape, (restarts or {}).get(replica.name), rng
        )
