"""Why the prefix cache missed: each request's prompt tokens as hits, new prefixes, evictions and
routing misses, from the request log; and the hit rate affinity routing would have reached on
the same requests.

In:  request rows in arrival order ``[ts, model, replica, tenant, prefix_hash, prompt_tokens,
     completion_tokens, weight]`` (``recorded_requests``: the gateway's log, which hashes each
     prompt's first tokens), each replica's KV cache in tokens (``vllm:cache_config_info``:
     ``num_gpu_blocks`` x ``block_size``), how many tokens the prefix hash covers (the gateway's
     ``affinity_prefix_tokens``), and when replicas restarted (their counters reset: the cache
     empties).
Out: - ``classify``: per request, its prompt tokens split into ``hit`` (the prefix was in this
       replica's cache), ``routing`` (not here, but warm on another replica of the same model at
       that moment), ``evicted`` (seen before on a replica of this model, and in no cache now),
       ``new_prefix`` (a prefix this model never saw before in the window) and ``unique`` (the rest
       of the prompt, and the whole of a prompt whose hash no other request in the window has:
       nobody shares it); they add up to ``prompt_tokens``;
     - ``affinity_routes``: the replica affinity routing (rendezvous hashing of the prefix, as
       ``fleet.gateway.routing`` does) would have sent each request to;
     - ``prefix_misses``: the classes per step and ``by`` (model, replica or tenant), from the
       store; ``.attrs``: ``hit_rate`` (modelled, tokens), ``affinity_hit_rate`` (the same
       requests routed by affinity), ``observed_hit_rate`` (the engines' own counters over the
       window, to judge the model by), ``misses`` (tokens of each reusable-miss class) and
       ``routing_share`` (of the prefix misses, the routing ones).

The cache model, per replica: an LRU of token runs, ``capacity`` tokens in all. A request's
prefix (its first ``prefix_tokens`` prompt tokens, or the median of the cached tokens the requests
with its hash reported) is one entry other requests with the same hash
reuse; the rest of its prompt and its output pass through as one entry nobody reuses, taking room
and so evicting the least recently used. A row of weight ``w`` stands for ``w`` requests (the
log is sampled): its pass-through entry weighs ``w`` times its tokens. This is what vLLM's
prefix cache does at block granularity (free blocks keep their prefix, evicted least recently
used first), without the blocks held by running requests, so it reads a little warmer than the
engine; the engines' own hit rate is reported beside it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from analytics.errors import BadInput
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.metrics import counter_increases
from analytics.tiers import param_time
from analytics.vllm import CACHE_CONFIG_INFO, PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS
from storage.clickhouse import Client

__all__ = [
    "CLASSES",
    "DEFAULT_PREFIX_TOKENS",
    "MAX_SPAN",
    "affinity_routes",
    "cache_capacity",
    "cache_configs",
    "classify",
    "misses_words",
    "prefix_lengths",
    "prefix_misses",
    "recorded_requests",
    "restarts",
]

CLASSES = ("hit", "routing", "evicted", "new_prefix", "unique")
MISSES = ("routing", "evicted", "new_prefix")  # a reusable prefix that missed
DEFAULT_PREFIX_TOKENS = 64  # the gateway's affinity_prefix_tokens by default
MAX_SPAN = timedelta(hours=6)  # request by request: a page reads at most the last hours of its range
COLUMNS = ["ts", "model", "replica", "tenant", "prefix_hash", "prompt_tokens", "completion_tokens", "weight"]


class _Cache:
    """One replica's prefix cache: an LRU of entries (a prefix hash, or a pass-through run)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = max(0.0, float(capacity))
        self.entries: OrderedDict[object, float] = OrderedDict()
        self.total = 0.0
        self._runs = 0

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def touch(self, key: object, tokens: float) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.total -= old
        self.entries[key] = tokens
        self.total += tokens
        self._evict()

    def pass_through(self, tokens: float) -> None:
        if tokens <= 0:
            return
        self._runs += 1
        self.entries[("run", self._runs)] = tokens
        self.total += tokens
        self._evict()

    def clear(self) -> None:
        self.entries.clear()
        self.total = 0.0

    def _evict(self) -> None:
        while self.total > self.capacity and self.entries:
            _key, tokens = self.entries.popitem(last=False)
            self.total -= tokens


def classify(
    requests: pd.DataFrame,
    capacity: Mapping[str, float],
    *,
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
    restarts: Mapping[str, Iterable[datetime | pd.Timestamp]] | None = None,
    default_capacity: float = 0.0,
    lengths: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """``requests`` (``COLUMNS``, any order) with the token classes (see the module docstring),
    in arrival order. A replica without a ``capacity`` gets ``default_capacity``; a prefix hash
    in ``lengths`` (``prefix_lengths``) is that many tokens long, the others ``prefix_tokens``."""
    lengths = lengths or {}
    rows = requests.sort_values("ts", kind="stable").reset_index(drop=True)
    caches: dict[str, _Cache] = {}
    seen: set[tuple[str, str]] = set()  # (model, prefix hash): a model's caches are its own
    # a hash on one row standing for one request is nobody else's prefix (the gateway hashes every prompt)
    uses = rows.groupby(rows["prefix_hash"].astype(str))["weight"].agg(["size", "sum"])
    alone = set(uses.index[(uses["size"] == 1) & (uses["sum"] <= 1)])
    by_model: dict[str, set[str]] = {}
    wipes = sorted(
        (pd.Timestamp(t).tz_localize("UTC") if pd.Timestamp(t).tzinfo is None else pd.Timestamp(t), str(r))
        for r, times in (restarts or {}).items()
        for t in times
    )
    next_wipe = 0
    out = {name: np.zeros(len(rows)) for name in CLASSES}
    times = pd.to_datetime(rows["ts"], utc=True)
    for i, (ts, model, replica, key, prompt, output, weight) in enumerate(
        zip(
            times,
            rows["model"].astype(str),
            rows["replica"].astype(str),
            rows["prefix_hash"].astype(str),
            rows["prompt_tokens"].to_numpy(float),
            rows["completion_tokens"].to_numpy(float),
            rows["weight"].to_numpy(float),
            strict=True,
        )
    ):
        while next_wipe < len(wipes) and wipes[next_wipe][0] <= ts:
            if wipes[next_wipe][1] in caches:
                caches[wipes[next_wipe][1]].clear()
            next_wipe += 1
        cache = caches.get(replica)
        if cache is None:
            cache = caches[replica] = _Cache(capacity.get(replica, default_capacity))
            by_model.setdefault(model, set()).add(replica)
        shared = min(float(lengths.get(key, prefix_tokens)), prompt) if key and key not in alone else 0.0
        out["unique"][i] = prompt - shared
        if shared > 0:
            if key in cache:
                out["hit"][i] = shared
            elif any(key in caches[r] for r in by_model.get(model, ()) if r != replica):
                out["routing"][i] = shared
            elif (model, key) in seen:
                out["evicted"][i] = shared
            else:
                out["new_prefix"][i] = shared
            seen.add((model, key))
            cache.touch(key, shared)
        cache.pass_through(max(1.0, weight) * (prompt - shared + output))
    for name in CLASSES:
        rows[name] = out[name]
    return rows


def prefix_lengths(requests: pd.DataFrame) -> dict[str, float]:
    """How long each prefix hash's shared prefix is where the log says: the median of the cached
    tokens the requests with that hash reported (the gateway hashes only the first tokens; a system prompt
    the engines reuse runs longer). Hashes no request reported cached tokens for are left out."""
    if "cached_tokens" not in requests or requests.empty:
        return {}
    seen = requests[(requests["prefix_hash"].astype(str) != "") & (requests["cached_tokens"] > 0)]
    # the median: a session's later turns cache their earlier turns too, longer than the prefix they share
    return {str(k): float(v) for k, v in seen.groupby("prefix_hash")["cached_tokens"].median().items()}


def _kept(rows: pd.DataFrame, filters: Filters) -> pd.Series:
    """The rows the view's filters keep (model, replica, tenant, route)."""
    keep = pd.Series(True, index=rows.index)
    for name in ("model", "replica", "tenant", "route"):
        wanted = getattr(filters, name, None)
        if wanted and name in rows:
            keep &= rows[name].astype(str).isin([str(w) for w in wanted])
    return keep


def _score(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "big")


def affinity_routes(requests: pd.DataFrame) -> pd.Series:
    """The replica affinity routing would have picked for each request: the highest rendezvous
    score of its prefix hash among the replicas that served its model in ``requests`` (a request
    without a prefix hash stays where it went)."""
    pools = {m: sorted(set(g.astype(str))) for m, g in requests.groupby("model")["replica"]}

    def best(model: str, replica: str, key: str) -> str:
        return max(pools[model], key=lambda r: _score(key, r)) if key else replica

    return pd.Series(
        [
            best(m, r, k)
            for m, r, k in zip(requests["model"], requests["replica"].astype(str), requests["prefix_hash"], strict=True)
        ],
        index=requests.index,
        dtype=object,
    )


def recorded_requests(
    client: Client, start: datetime, end: datetime, *, filters: Filters | None = None
) -> pd.DataFrame:
    """The request log's rows in ``[start, end)`` that a replay or the cache model reads: the
    gateway's (it hashes the prompts' prefixes and knows the route) when it logged any, else the
    engines' spans. ``COLUMNS`` plus ``route``, ``session``, ``cached_tokens``, ``max_tokens``, ``source`` and the
    recorded latencies (``ttft_seconds``, ``itl_seconds``, ``queue_seconds``, ``e2e_seconds``)."""
    where, params = request_rows(None, filters)
    params.update(start=param_time(start), end=param_time(end))
    sql = f"""
        SELECT ts, source, model, replica, tenant, route, session, prefix_hash, prompt_tokens, completion_tokens,
               cached_tokens, max_tokens, weight, ttft_seconds, itl_seconds, queue_seconds, e2e_seconds, outcome
        FROM requests
        WHERE ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}} AND {where}
          AND source = (SELECT if(countIf(source = 'gateway') > 0, 'gateway', 'otlp') FROM requests
                        WHERE ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}})
        ORDER BY ts"""
    df = query_df(client, sql, parameters=params)
    for name in (
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "max_tokens",
        "weight",
        "ttft_seconds",
        "itl_seconds",
        "queue_seconds",
        "e2e_seconds",
    ):
        if name in df:
            df[name] = df[name].astype("float64")
    if len(df):
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def cache_configs(client: Client) -> dict[str, tuple[int, int]]:
    """Each replica's KV cache as its ``vllm:cache_config_info`` last said: (``num_gpu_blocks``,
    ``block_size``). A replica whose engine did not say both is left out."""
    rows = client.query(  # series rows carry no window of their own (a replayed history writes them later)
        "SELECT replica, argMax(labels['num_gpu_blocks'], last_seen), argMax(labels['block_size'], last_seen) "
        "FROM series WHERE metric = {m:String} GROUP BY replica",
        parameters={"m": CACHE_CONFIG_INFO},
    ).result_rows
    out: dict[str, tuple[int, int]] = {}
    for replica, blocks, size in rows:
        try:
            out[str(replica)] = (int(blocks), int(size))
        except ValueError:  # "None" where the engine did not say
            continue
    return out


def cache_capacity(client: Client, configs: Mapping[str, tuple[int, int]] | None = None) -> dict[str, float]:
    """Each replica's KV cache in tokens (``num_gpu_blocks`` x ``block_size``, from ``configs`` or
    ``cache_configs``), less vLLM's null block."""
    found = cache_configs(client) if configs is None else configs
    return {replica: float(max(0, blocks - 1) * size) for replica, (blocks, size) in found.items()}


def restarts(client: Client, start: datetime, end: datetime) -> dict[str, list[datetime]]:
    """When each replica's engine restarted in ``[start, end)``: its prompt-token counter reset
    (the collector marks a drop as a reset). Read from the raw samples."""
    rows = client.query(
        "SELECT s.replica, v.ts FROM samples AS v INNER JOIN (SELECT fingerprint, any(replica) AS replica FROM series "
        "WHERE metric = {m:String} GROUP BY fingerprint) AS s ON s.fingerprint = v.fingerprint "
        "WHERE v.metric = {m:String} AND v.reset > 0 AND v.ts >= {s:DateTime64(3)} "
        "AND v.ts < {e:DateTime64(3)} ORDER BY v.ts",
        parameters={"m": PROMPT_TOKENS, "s": param_time(start), "e": param_time(end)},
    ).result_rows
    out: dict[str, list[datetime]] = {}
    for replica, ts in rows:
        out.setdefault(str(replica), []).append(ts)
    return out


@dataclass(frozen=True)
class _Totals:
    tokens: dict[str, float]

    @property
    def prompt(self) -> float:
        return sum(self.tokens.values())

    @property
    def hit_rate(self) -> float:
        return self.tokens["hit"] / self.prompt if self.prompt > 0 else float("nan")


def _totals(df: pd.DataFrame) -> _Totals:
    w = df["weight"].to_numpy(float) if len(df) else np.array([])
    return _Totals({name: float((df[name].to_numpy(float) * w).sum()) if len(df) else 0.0 for name in CLASSES})


def prefix_misses(
    client: Client,
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Per step and ``by`` (model, replica or tenant): the weighted prompt tokens of each class
    (``CLASSES``) and ``hit_rate``; see the module docstring for ``.attrs``. At most the last
    ``MAX_SPAN`` of the window is read (``.attrs["start"]`` says from when)."""
    if by not in ("model", "replica", "tenant"):
        raise BadInput("by must be model, replica or tenant")
    start = max(start, end - MAX_SPAN)
    # every request fills the caches, whatever the view shows: the filters apply to the classes after
    rows = recorded_requests(client, start, end)
    rows = rows[rows["outcome"].isin(["ok", ""])] if "outcome" in rows else rows
    columns = ["ts", by, *CLASSES, "hit_rate"]
    if rows.empty:
        out = pd.DataFrame(columns=columns)
        out.attrs.update(start=start, hit_rate=float("nan"), affinity_hit_rate=float("nan"), routing_share=float("nan"))
        return out
    capacity = cache_capacity(client)
    wiped = restarts(client, start, end)
    lengths = prefix_lengths(rows)
    found = classify(rows[[*COLUMNS, "route"]], capacity, prefix_tokens=prefix_tokens, restarts=wiped, lengths=lengths)
    routed = rows[COLUMNS].assign(replica=affinity_routes(rows))
    affinity = classify(routed, capacity, prefix_tokens=prefix_tokens, restarts=wiped, lengths=lengths)
    if filters is not None:
        keep = _kept(found, filters)
        found, affinity = found[keep], affinity[keep.to_numpy()]
    seconds = int(step) if step else max(60, int((end - start).total_seconds() // 60 // 60 * 60) or 60)
    found["step"] = found["ts"].dt.floor(f"{seconds}s")
    weighted = found[list(CLASSES)].mul(found["weight"], axis=0).assign(ts=found["step"], **{by: found[by]})
    out = weighted.groupby(["ts", by], as_index=False)[list(CLASSES)].sum()
    total = out[list(CLASSES)].sum(axis=1)
    out["hit_rate"] = (out["hit"] / total).where(total > 0)
    ours, theirs = _totals(found), _totals(affinity)
    missed = {name: ours.tokens[name] for name in MISSES}
    engines = counter_increases(client, [PREFIX_HITS, PREFIX_QUERIES], start, end, "fleet", filters=filters)
    by_metric = engines.set_index("metric")["increase"] if len(engines) else pd.Series(dtype=float)
    queries = float(by_metric.get(PREFIX_QUERIES, 0.0))
    out.attrs.update(
        start=start,
        step=seconds,
        hit_rate=ours.hit_rate,
        affinity_hit_rate=theirs.hit_rate,
        observed_hit_rate=float(by_metric.get(PREFIX_HITS, 0.0)) / queries if queries > 0 else float("nan"),
        misses=missed,
        routing_share=missed["routing"] / sum(missed.values()) if sum(missed.values()) > 0 else float("nan"),
        prefix_tokens=prefix_tokens,
        requests=float(found["weight"].sum()),
    )
    result: pd.DataFrame = out[columns]
    result.attrs.update(out.attrs)
    return result


def misses_words(misses: Mapping[str, float], affinity_hit_rate: float | None = None) -> str:
    """The prefix misses in words: "71 % of the misses were routing misses (warm on another
    replica), 20 % evictions, 9 % new prefixes[; affinity routing would have hit 54 %]"; "" when
    nothing missed."""
    total = sum(misses.get(name, 0.0) for name in MISSES)
    if total <= 0:
        return ""
    share = {name: misses.get(name, 0.0) / total for name in MISSES}
    words = (
        f"{share['routing']:.0%} of the misses were routing misses (warm on another replica), "
        f"{share['evicted']:.0%} evictions, {share['new_prefix']:.0%} new prefixes"
    )
    if affinity_hit_rate is not None and np.isfinite(affinity_hit_rate):
        words += f"; affinity routing would have hit {affinity_hit_rate:.0%}"
    return words
