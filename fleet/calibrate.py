"""What the engines sustain here: the demo's request rate and SLO targets, measured before it plays.

In:  the fleet's real engines (up and warmed), grouped by model (``{model: [base URLs]}``), and
     the scenario whose first mix (its steady phase) is to be played.
Out: ``calibrate(...)`` (``probe`` then ``derive``) -> ``Calibration``: each model pool kept
     busy with the steady mix's own request shapes for ``probe_s`` seconds (a closed loop of
     ``per_replica`` requests in flight on each replica, every pool at once, as they share the
     machine during the demo), giving the requests/s each pool completes and its p99 time to
     first token under that load. From them: ``sustained_rps`` (the steady mix's requests/s the
     fleet sustains: the pool that fills first decides), ``rate_scale`` (the scenario's rate
     times it puts the steady phase's peak load, its bursts, at ``utilisation`` of that and its
     mean at most ``mean_utilisation``) and ``slo_ttft_s`` per model: the steady mix is then
     played open loop at that rate for ``play_s`` seconds, and each target is ``PLAYED_MARGIN``
     x the p99 TTFT played (at most ``TAIL_RATIO`` x its p90: a few dozen requests' p99 is their
     slowest; at most ``BUSY_CEILING`` x the fully busy p99, the better measured of the two, and
     at least that p99, which the steady phase meets when two long prompts share a replica),
     raised to the next bucket bound of the engines' own TTFT histogram (``with_played_slos``;
     without enough timed requests, ``margin`` x the fully busy p99). On a pool whose KV cache
     (read from the engines' ``/metrics``) holds fewer than two of the mix's long-context
     requests, a request queues behind one of them in a healthy phase: there the floor is
     ``QUEUE_MARGIN`` x the longest one the probe timed alone (``queue_waits``) instead of the
     fully busy p99 (whose 4 requests in flight per replica queue behind the probe's long ones as
     the steady phase does not). The rules read the p99 from that histogram,
     interpolated inside a bucket: a target inside a wide bucket (2 s in (1, 2.5]) is crossed by
     interpolation alone while every request is well under it; at a bound, the p99 is above the
     target only when more than 1 % of the requests were. ``Calibration.line()`` says it in one line.
     ``derive(...)`` is the arithmetic alone, on finished probe requests. The play holds one of
     the steady mix's bursts (``played_mix``). How hard the rollout then hits: ``fleet.rollout``.

The probe goes to the engines directly, not through the gateway: the gateway's request log is
the demo's, and the probe is set-up. It runs before the collector watches, so the engines'
histograms count it before their first scrape, which is the baseline every increase starts from.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx

from fleet.errors import FleetError
from fleet.loadgen import percentile, send_request
from fleet.traffic import Scenario, TrafficMix, plan_request

__all__ = [
    "TEMPLATE_TTFT_BOUNDS",
    "Calibration",
    "CalibrationError",
    "Played",
    "Probe",
    "calibrate",
    "cache_limited",
    "derive",
    "kv_cache_tokens",
    "long_request_tokens",
    "mean_rate",
    "peak_rate",
    "play",
    "played_mix",
    "pool_kv_tokens",
    "pool_shares",
    "probe",
    "queue_waits",
    "target_at_bound",
    "ttft_bounds",
    "with_played_slos",
]

# the steady phase's peak load (its bursts) as a share of what the engines sustain: the probe runs
# before the collector, the evaluator and the dashboard share the cores with the engines, and a
# burst near capacity fills a queue whose tail the 5-minute p99 keeps for minutes
UTILISATION = 0.6
# ... and its mean at most this share: requests of widely different lengths queue behind each other far
# below the closed loop's throughput (two tiny-small replicas here, the steady mix open loop for 40 s at
# 16 / 33 / 49 % of what the probe measured: p99 TTFT 2.0 / 4.3 / 8.1 s). The shipped scenario's bursts
# (2.5x its rate) put its mean at 29 %; a mix without bursts would otherwise play at 60 %
MEAN_UTILISATION = 0.3
# a request queues behind a long-context request on a replica whose KV cache holds one of them and not
# two (vLLM admits its waiting requests in order), for as long as that request takes. A pool whose cache
# holds fewer than two typical long-context requests (median prompt + median output) gets an SLO target
# of at least this x the time one such request takes alone on one of its replicas: two of them queued
# in a row, and the cores shared with the collector, the dashboard and the rules during the demo (here:
# 2.4 s alone; the second of two sent together began 2.0 s late; the steady mix open loop at a third of
# what the probe measured, 40 s: p99 TTFT 4.3 s, its slowest 5.2 s)
QUEUE_MARGIN = 3.0
# the rollout saturates the pools whose cache holds one long request; their TTFT page needs a p99, which the
# rules judge only over enough requests (``pool_floor_rps``, from the caller: the rules are not the fleet's).
# On engines too slow for that at the rate above (three engines on two cores on a slow day: 0.34 req/s,
# 77 of tiny-small's requests in 5 minutes), the rate is raised to it, with the mean at most this share
FLOOR_CEILING = 0.6
MARGIN = 1.5  # SLO p99 TTFT = this x the p99 measured with the engines fully busy
PROBE_S = 20.0
WARM_S = 3.0  # the probe's first seconds: the loops fill up, not counted
PER_REPLICA = 4  # requests in flight per replica during the probe
MIN_FINISHED = 3  # fewer finished requests of a pool than this: nothing to tell
PLAY_S = 30.0  # then the steady mix played at the calibrated rate: its p99 TTFT sets the SLO targets
PLAYED_MARGIN = 2.0  # SLO p99 TTFT = this x the p99 played at the calibrated rate
MIN_PLAYED = 5
# 30 s played is a few dozen requests per pool: their p99 is the slowest one or two, and one long
# prompt queued behind a burst set a 40 s target once (the steady phase's own p99 was 1.2 s). The
# p99 taken is at most this x their p90 (the steady phase's p99/p90 in a logged run: 2.9 and 1.4)
TAIL_RATIO = 3.0
# ... and the target stays between the fully busy p99 and this x it (the probe keeps the engines
# busy for 17 s with a known load; the play is a few dozen requests: in one run the start of the
# play met two long prompts at once, its p90 was 9.5 s and the target 40 s, which the incident
# crossed 4 minutes late; on a slower day it would not have crossed at all)
BUSY_CEILING = 2.0


_TTFT_BUCKET = re.compile(r'^vllm:time_to_first_token_seconds_bucket\{[^}]*\ble="([^"]+)"', re.M)
_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _template_bounds() -> tuple[float, ...]:
    from fleet.sim.metrics import TEMPLATE

    family = next(f for f in TEMPLATE["families"] if f["name"] == "vllm:time_to_first_token_seconds")
    les = {dict(labels)["le"] for name, labels, _ in family["samples"] if name.endswith("_bucket")}
    return tuple(sorted(float(le) for le in les if le != "+Inf"))


# vLLM 0.32's TTFT buckets (0.001 ... 2560 s), as captured from a real engine
TEMPLATE_TTFT_BOUNDS = _template_bounds()


class CalibrationError(FleetError):
    """The probe did not measure enough to calibrate: the reason, in words."""


@dataclass(frozen=True)
class Probe:
    """One finished probe request: its pool, whether it succeeded, its TTFT, when it ended (s,
    from the start of the loops), whether it was one of the mix's long-context requests, how long
    it took in all, and whether it ran alone (the long-context request timed before the loops)."""

    model: str
    ok: bool
    ttft_s: float | None
    finished_s: float
    long_context: bool = False
    e2e_s: float | None = None
    alone: bool = False  # sent before the loops, on an otherwise idle replica


@dataclass(frozen=True)
class Played:
    """A pool's requests played at the calibrated rate: how many were timed, their p90 and p99 TTFT."""

    requests: int
    p90_s: float
    p99_s: float

    def __str__(self) -> str:
        return f"{self.requests} requests, p90 {self.p90_s:.2g}s, p99 {self.p99_s:.2g}s"


@dataclass(frozen=True)
class Calibration:
    sustained_rps: float  # requests/s of the steady mix the engines sustain
    pool_rps: dict[str, float]  # requests/s each pool completed while all were busy
    loaded_p99_s: dict[str, float]  # p99 TTFT per pool under that load
    planned_rps: float  # the steady phase's mean request rate, bursts included, as played
    peak_rps: float  # its rate during a burst, as played
    scenario_rps: float  # the same, as the scenario states it
    utilisation: float
    margin: float
    slo_ttft_s: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    slo_basis: str = ""  # how the targets were set, in words
    played_ttft: dict[str, Played] = field(default_factory=dict)  # per pool, what the targets came from
    # per pool whose KV cache holds fewer than two long-context requests: how long one takes alone (a
    # request behind it on its replica waits that long); the target is at least QUEUE_MARGIN x it
    queue_wait_s: dict[str, float] = field(default_factory=dict)
    # the pool whose p99 needed the rate raised (``pool_floor_rps``), and whether the engines allowed it all
    floor_pool: str = ""
    floor_short: bool = False

    @property
    def rate_scale(self) -> float:
        return self.planned_rps / self.scenario_rps

    def line(self) -> str:
        slo = ", ".join(f"{m} {s:g}s" for m, s in sorted(self.slo_ttft_s.items()))
        bursts = (
            f", bursts to {self.peak_rps:.2g} ({self.peak_rps / self.sustained_rps:.0%})"
            if self.peak_rps > self.planned_rps * 1.001
            else ""
        )
        floor = ""
        if self.floor_pool:
            floor = f", raised so that {self.floor_pool}'s SLO window holds the requests a p99 needs" + (
                f" (the most these engines allow: {self.floor_pool}'s p99 may stay too few to judge)"
                if self.floor_short
                else ""
            )
        return (
            f"calibrated: engines sustain ~{self.sustained_rps:.2g} req/s of the steady mix here; playing at "
            f"{self.planned_rps:.2g} req/s ({self.planned_rps / self.sustained_rps:.0%} of it{floor}){bursts}; "
            f"x{self.rate_scale:.2g} the scenario's rate; SLO p99 TTFT <= {slo} ({self.slo_basis})"
        )


def peak_rate(mix: TrafficMix) -> float:
    """The mix's highest request rate: its rate in a burst, at the diurnal peak."""
    rate = mix.rate * (1 + mix.diurnal.amplitude if mix.diurnal is not None else 1)
    return rate * (mix.burst.factor if mix.burst is not None else 1)


def mean_rate(mix: TrafficMix) -> float:
    """The mix's mean requests/s over time: its rate, with the burst's extra share (the diurnal
    shape averages out)."""
    rate = mix.rate
    if mix.burst is not None:
        rate *= 1 + (mix.burst.factor - 1) * min(mix.burst.length_s, mix.burst.every_s) / mix.burst.every_s
    return rate


def pool_shares(mix: TrafficMix) -> dict[str, float]:
    """Each model's share of the mix's requests (tenant weights x their model weights)."""
    shares: dict[str, float] = {}
    total_tenants = sum(t.weight for t in mix.tenants)
    for tenant in mix.tenants:
        models = tenant.models or mix.models
        weight_sum = sum(models.values())
        for model, weight in models.items():
            shares[model] = shares.get(model, 0.0) + (tenant.weight / total_tenants) * weight / weight_sum
    return {m: s for m, s in shares.items() if s > 0}


def _p99(values: list[float]) -> float:
    found = percentile(values, 0.99)
    assert found is not None  # callers count their values first
    return found


def long_request_tokens(mix: TrafficMix) -> int:
    """A typical long-context request of ``mix`` in the KV cache: its median prompt and output; 0 when
    the mix sends none."""
    if mix.long_context_share <= 0 and not any((t.long_context_share or 0) > 0 for t in mix.tenants):
        return 0
    output = mix.long_output_tokens or mix.output_tokens
    return int(mix.long_prompt_tokens.median + output.median)


def cache_limited(mix: TrafficMix, kv_tokens: dict[str, int]) -> list[str]:
    """The pools of ``mix`` whose KV cache (``kv_tokens``, the smallest replica's; a pool missing from
    it is taken to hold one) has room for fewer than two of the mix's typical long-context requests:
    a request behind one of them waits for it. None when the mix sends no long-context request."""
    need = long_request_tokens(mix)
    return sorted(m for m in pool_shares(mix) if need and kv_tokens.get(m, 0) < 2 * need)


def queue_waits(probes: list[Probe], mix: TrafficMix, kv_tokens: dict[str, int]) -> dict[str, float]:
    """Per pool in ``cache_limited``: how long the long-context request the probe sent alone took
    (the longest, if several). A request behind one on its replica waits that long."""
    out: dict[str, float] = {}
    for model in cache_limited(mix, kv_tokens):
        took = [p.e2e_s for p in probes if p.model == model and p.ok and p.alone and p.e2e_s is not None]
        if took:
            out[model] = max(took)
    return out


def derive(
    probes: list[Probe],
    mix: TrafficMix,
    *,
    probe_s: float = PROBE_S,
    warm_s: float = WARM_S,
    utilisation: float = UTILISATION,
    mean_utilisation: float = MEAN_UTILISATION,
    margin: float = MARGIN,
    bounds: tuple[float, ...] = (),
    kv_tokens: dict[str, int] | None = None,
    pool_floor_rps: float = 0.0,
) -> Calibration:
    """The calibration from finished probe requests (see the module docstring); ``bounds``, the
    engines' TTFT bucket bounds, which the SLO targets are raised to (none: half seconds);
    ``kv_tokens``, each pool's KV cache in tokens (its smallest replica's; unknown: it may hold one
    long-context request and not two); ``pool_floor_rps``, the requests/s each pool in
    ``cache_limited`` (the ones the rollout saturates) is to get at least, so that the rules can
    judge its p99 (the rate raised to it, its mean at most ``FLOOR_CEILING`` of what the engines
    sustain)."""
    shares = pool_shares(mix)
    span = probe_s - warm_s
    pool_rps: dict[str, float] = {}
    loaded: dict[str, float] = {}
    for model in shares:
        mine = [p for p in probes if p.model == model and not p.alone]
        counted = [p for p in mine if p.ok and warm_s <= p.finished_s <= probe_s]
        ttfts = [p.ttft_s for p in mine if p.ok and p.ttft_s is not None]
        failed = [p for p in mine if not p.ok]
        if len(counted) < MIN_FINISHED or len(ttfts) < MIN_FINISHED:
            raise CalibrationError(
                f"the {model} engines finished {len(counted)} probe request(s) in {span:g}s"
                + (f" ({len(failed)} failed)" if failed else "")
                + ": too few to measure what they sustain"
            )
        pool_rps[model] = len(counted) / span
        loaded[model] = _p99(ttfts)
    # the mix sends `share` of its requests to each pool: the pool that fills first decides
    sustained = min(pool_rps[m] / shares[m] for m in shares)
    # the peak at `utilisation` of what the engines sustain, the mean in proportion to the mix's
    # shape, and the mean at most `mean_utilisation` of it
    planned = min(utilisation * sustained * mean_rate(mix) / peak_rate(mix), mean_utilisation * sustained)
    floors = {m: pool_floor_rps / shares[m] for m in cache_limited(mix, kv_tokens or {})}
    floor_pool = max(floors, key=lambda m: floors[m]) if floors and max(floors.values()) > planned else ""
    if floor_pool:
        planned = min(floors[floor_pool], FLOOR_CEILING * sustained)
    peak = planned * peak_rate(mix) / mean_rate(mix)
    waits = queue_waits(probes, mix, kv_tokens or {})
    slo = {m: target_at_bound(max(0.5, margin * loaded[m], QUEUE_MARGIN * waits.get(m, 0.0)), bounds) for m in shares}
    return Calibration(
        sustained_rps=sustained,
        pool_rps=pool_rps,
        loaded_p99_s=loaded,
        planned_rps=planned,
        peak_rps=peak,
        scenario_rps=mean_rate(mix),
        utilisation=utilisation,
        margin=margin,
        slo_ttft_s=slo,
        requests=len(probes),
        slo_basis=f"{margin:g}x the p99 with the engines fully busy" + _queue_tail(waits) + _basis_tail(bounds),
        queue_wait_s=waits,
        floor_pool=floor_pool,
        floor_short=bool(floor_pool) and floors[floor_pool] > planned * 1.001,
    )


def _queue_words(waits: dict[str, float]) -> str:
    took = ", ".join(f"{m} {s:.2g}s" for m, s in sorted(waits.items()))
    return f"{QUEUE_MARGIN:g}x a long-context request alone on a cache that holds one ({took})"


def _queue_tail(waits: dict[str, float]) -> str:
    return f"; at least {_queue_words(waits)}" if waits else ""


def _basis_tail(bounds: tuple[float, ...]) -> str:
    return ", up to a TTFT bucket bound" if bounds else ""


def target_at_bound(seconds: float, bounds: tuple[float, ...]) -> float:
    """``seconds`` raised to the smallest of ``bounds`` at or above it; above them all or without
    any, rounded up to half a second."""
    for bound in sorted(bounds):
        if bound >= seconds - 1e-9:
            return bound
    return math.ceil(2 * seconds - 1e-9) / 2


def with_played_slos(
    cal: Calibration,
    played: list[Probe],
    *,
    seconds: float,
    margin: float = PLAYED_MARGIN,
    bounds: tuple[float, ...] = (),
) -> Calibration:
    """``cal`` with each pool's SLO p99 TTFT set from requests played at the calibrated rate:
    ``margin`` x their p99 (at most ``TAIL_RATIO`` x their p90), kept between the p99 the probe
    measured with the engines fully busy (``cal.loaded_p99_s``: the steady phase meets such
    moments) and ``BUSY_CEILING`` x it, at least 1 s and ``QUEUE_MARGIN`` x ``cal.queue_wait_s``
    (a request behind a long-context request that fills the cache), raised to the next of ``bounds`` (none:
    half a second). A pool with fewer than ``MIN_PLAYED`` timed requests keeps the target from
    the fully busy probe. ``played_ttft`` keeps what was played, per pool."""
    slo = dict(cal.slo_ttft_s)
    seen: dict[str, Played] = {}  # the pools whose targets the play set
    for model in slo:
        ttfts = [p.ttft_s for p in played if p.model == model and p.ok and p.ttft_s is not None]
        if len(ttfts) >= MIN_PLAYED:
            p90, p99 = percentile(ttfts, 0.9) or 0.0, _p99(ttfts)
            seen[model] = Played(len(ttfts), p90, p99)
            # at most twice the p99 with the engines fully busy: a few dozen played requests that met
            # a queue tell less than the busy probe. At least the moments the steady phase meets: on a
            # cache that holds one long-context request, the wait behind one (measured alone); on
            # another, the fully busy p99 (on such a cache the probe's 4 requests in flight per
            # replica queue behind its long requests as the steady phase does not: 13 s on a slow day,
            # where a long request alone took 2.6 s and the steady phase's p99 was 1-2 s)
            busy = cal.loaded_p99_s.get(model, 0.0)
            played_target = margin * min(p99, TAIL_RATIO * p90)
            wanted = min(played_target, BUSY_CEILING * busy) if busy > 0 else played_target
            wait = cal.queue_wait_s.get(model)
            wanted = max(wanted, QUEUE_MARGIN * wait if wait is not None else busy)
            slo[model] = target_at_bound(max(1.0, wanted), bounds)
    if not seen:
        return cal
    basis = (
        f"{margin:g}x the p99 of {seconds:g}s played at that rate (at most {TAIL_RATIO:g}x its p90), "
        f"at most {BUSY_CEILING:g}x the p99 with the engines fully busy, at least "
        + (f"{_queue_words(cal.queue_wait_s)}, elsewhere " if cal.queue_wait_s else "")
        + "that p99"
        + _basis_tail(bounds)
    )
    if len(seen) < len(slo):
        basis += f"; {', '.join(sorted(set(slo) - set(seen)))}: {cal.margin:g}x the p99 with the engines fully busy"
    return replace(cal, slo_ttft_s=slo, slo_basis=basis, played_ttft=seen)


def ttft_bounds(urls: list[str], *, timeout: float = 5.0) -> tuple[float, ...] | None:
    """The finite bucket bounds of the TTFT histogram on the first of ``urls`` whose ``/metrics``
    has one; None when none has (the caller falls back to ``TEMPLATE_TTFT_BOUNDS``)."""
    for url in urls:
        try:
            text = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout).text
        except httpx.HTTPError:
            continue
        found = set()
        for le in _TTFT_BUCKET.findall(text):
            try:
                value = float(le)
            except ValueError:
                continue
            if math.isfinite(value):
                found.add(value)
        if found:
            return tuple(sorted(found))
    return None


def kv_cache_tokens(url: str, *, timeout: float = 5.0) -> int | None:
    """The tokens the KV cache of the engine at ``url`` holds, from its ``vllm:cache_config_info``
    (``kv_cache_size_tokens``, or ``num_gpu_blocks`` x ``block_size``); None when it does not say."""
    try:
        text = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return None
    found = _CACHE_CONFIG.search(text)
    if found is None:
        return None
    labels = dict(_LABEL.findall(found.group(1)))
    if labels.get("kv_cache_size_tokens", "").isdigit():  # vLLM 0.32
        return int(labels["kv_cache_size_tokens"])
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else None


def pool_kv_tokens(pools: dict[str, list[str]]) -> dict[str, int]:
    """Each pool's KV cache in tokens: its smallest replica's, where every replica says."""
    out: dict[str, int] = {}
    for model, urls in pools.items():
        sizes = [kv_cache_tokens(u) for u in urls]
        if sizes and all(s is not None for s in sizes):
            out[model] = min(s for s in sizes if s is not None)
    return out


def _longs_only(mix: TrafficMix) -> TrafficMix:
    tenants = [t.model_copy(update={"long_context_share": None}) for t in mix.tenants]
    return mix.model_copy(update={"long_context_share": 1.0, "tenants": tenants})


async def probe(
    pools: dict[str, list[str]],
    mix: TrafficMix,
    *,
    probe_s: float = PROBE_S,
    per_replica: int = PER_REPLICA,
    seed: int = 7,
    alone: list[str] | tuple[str, ...] = (),
) -> list[Probe]:
    """Keep every pool busy with its share of ``mix``'s request shapes for ``probe_s`` seconds:
    ``per_replica`` loops per replica URL, each sending the next request when one finishes. Before
    the loops, one of the mix's long-context requests is timed on the first replica of each pool
    in ``alone``, one pool after another, with nothing else sent (``queue_waits``)."""
    rng = random.Random(seed)
    ids = random.Random()
    out: list[Probe] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(probe_s * 3, connect=5.0)) as client:
        start = time.perf_counter()

        async def one(model: str, url: str, mix: TrafficMix, *, alone: bool = False) -> None:
            plan = plan_request(mix, rng)
            trace = f"{ids.getrandbits(128):032x}"
            traceparent = f"00-{trace}-{ids.getrandbits(64):016x}-01"
            result = await send_request(client, url, plan, trace, traceparent, "calibration")
            finished = time.perf_counter() - start
            out.append(Probe(model, result.ok, result.ttft_s, finished, plan.long_context, result.e2e_s, alone))

        async def loop(model: str, url: str, mix: TrafficMix) -> None:
            while time.perf_counter() - start < probe_s:
                await one(model, url, mix)

        # the pool's own requests: this model only, streamed (the TTFT is read from the stream)
        tenants = [t.model_copy(update={"models": None}) for t in mix.tenants]
        own = {m: mix.model_copy(update={"models": {m: 1.0}, "tenants": tenants, "stream_share": 1.0}) for m in pools}
        for model in alone if long_request_tokens(mix) else ():
            await one(model, pools[model][0], _longs_only(own[model]), alone=True)
        began, start = start, time.perf_counter()  # the loops' time: what ran alone ended before it
        out[:] = [replace(p, finished_s=p.finished_s - (start - began)) for p in out]
        await asyncio.gather(
            *(loop(m, url, own[m]) for m, urls in pools.items() for url in urls for _ in range(per_replica))
        )
    return out


def played_mix(mix: TrafficMix, seconds: float) -> TrafficMix:
    """``mix`` as ``play`` sends it for ``seconds``: every request streamed (its TTFT read from the
    stream), and its first burst a third of the way in, so that the play holds one with time left
    for the queue it fills to drain."""
    update: dict[str, object] = {"stream_share": 1.0}
    if mix.burst is not None:
        update["burst"] = mix.burst.model_copy(update={"offset_s": seconds / 3})
    return mix.model_copy(update=update)


async def play(pools: dict[str, list[str]], mix: TrafficMix, rate_scale: float, seconds: float) -> list[Probe]:
    """The steady mix played open loop (Poisson arrivals) at ``rate_scale`` times its rate for
    ``seconds``, straight to the engines, with one of its bursts a third of the way in (the steady
    phase meets them, and a target set without one was crossed by the second burst of a demo:
    p99 3.2 s against 2.5 s): each finished request as a ``Probe``."""
    from fleet.loadgen import RequestResult, Targets, run_scenario

    start = time.perf_counter()
    out: list[Probe] = []

    def done(result: RequestResult) -> None:
        out.append(Probe(result.model, result.ok, result.ttft_s, time.perf_counter() - start))

    steady = Scenario(name="calibration", duration_s=seconds, mix=played_mix(mix, seconds))
    await run_scenario(steady, Targets(by_model=pools), rate_scale=rate_scale, duration_s=seconds, on_result=done)
    return out


def calibrate(
    pools: dict[str, list[str]],
    mix: TrafficMix,
    *,
    probe_s: float = PROBE_S,
    warm_s: float = WARM_S,
    per_replica: int = PER_REPLICA,
    utilisation: float = UTILISATION,
    margin: float = MARGIN,
    play_s: float = PLAY_S,
    seed: int = 7,
    pool_floor_rps: float = 0.0,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Probe the engines (``pools``: model -> replica base URLs) with ``mix`` and derive the
    calibration. Raises ``CalibrationError`` when they finish too few requests to tell."""
    wanted = set(pool_shares(mix))
    missing = sorted(wanted - set(pools))
    if missing:
        raise CalibrationError(f"the steady mix sends to {', '.join(missing)}, which no real engine serves")
    kv = pool_kv_tokens({m: pools[m] for m in wanted})
    limited = cache_limited(mix, kv)
    if progress:
        replicas = sum(len(pools[m]) for m in wanted)
        progress(
            "calibrating: "
            + (
                f"a long-context request alone on {', '.join(limited)} (a cache that holds one), then "
                if limited
                else ""
            )
            + f"{probe_s:g}s of the steady mix, {per_replica} requests in flight on each of {replicas} engine(s)"
        )
    probes = asyncio.run(
        probe({m: pools[m] for m in wanted}, mix, probe_s=probe_s, per_replica=per_replica, seed=seed, alone=limited)
    )
    bounds = ttft_bounds([u for m in sorted(wanted) for u in pools[m]]) or TEMPLATE_TTFT_BOUNDS
    cal = derive(
        probes,
        mix,
        probe_s=probe_s,
        warm_s=warm_s,
        utilisation=utilisation,
        margin=margin,
        bounds=bounds,
        kv_tokens=kv,
        pool_floor_rps=pool_floor_rps,
    )
    if play_s <= 0:
        return cal
    if progress:
        progress(f"calibrating: {play_s:g}s of the steady mix at {cal.planned_rps:.2g} req/s (its SLO targets)")
    played = asyncio.run(play({m: pools[m] for m in wanted}, mix, cal.rate_scale, play_s))
    cal = with_played_slos(cal, played, seconds=play_s, bounds=bounds)
    if progress and cal.played_ttft:
        progress(
            "played: "
            + "; ".join(
                f"{m} {p} (fully busy: p99 {cal.loaded_p99_s[m]:.2g}s"
                + (f"; a long-context request alone {cal.queue_wait_s[m]:.2g}s" if m in cal.queue_wait_s else "")
                + ")"
                for m, p in sorted(cal.played_ttft.items())
            )
        )
    return cal
