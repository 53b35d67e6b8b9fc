"""A change in a view's cost per token, attributed to its causes: Shapley values over the
factors of the cost rule. Pure arithmetic, no reads.

In:  one view (the fleet, a model pool, or a payer: a tenant, a route, a LoRA adapter) over two
     periods, each a ``Side``: per pool (per hour, so periods of different lengths compare) the
     pool's spend ``S``, the view's part of it ``D`` (``analytics.allocation``'s rule, summed over
     the period), the view's weighted tokens in the pool ``w`` and the pool's other weighted
     tokens ``o``; and the view's tokens ``x`` (prompt + output: what its cost per token divides
     by).
Out: ``decompose``: rows ``[kind, pool, usd_per_token]`` whose sum is the change of
     ``level(side) = sum of D_p / x`` from before to after:
     - ``traffic``: the view's own tokens: how many it sent, in which pools and when (a tenant
       that moved its tokens to another pool; the fleet serving fewer tokens); one row per pool
       the effect passed through (a move between two pools reads as one flow: sum them);
     - ``volume``: the other tokens sharing a pool (a payer's share of a pool grows when the
       others leave it: its unchanged spend spread over fewer tokens). Payer views only;
     - ``spend``: a pool's spend (replicas up, for more or less of the period).

The rule as a function of its factors: for a payer, the view's cost per token is
``C = sum_p S_p * sigma(w_p, o_p) * t_p / x`` with ``sigma(w, o) = w / (w + o)`` (0 when the
pool served nobody) and ``t_p`` the timing factor below; for the fleet ``C = sum_p S_p / x``
(every pool's spend is the fleet's, used or not), for one pool ``C = S_p / x``. The factors are
the players: the view's traffic (``w`` and ``t`` in every pool, and ``x``, as one player), each
pool's other tokens, each pool's spend. Each player's part is its Shapley value: its marginal
effect (changing it from before to after) averaged over every order of changing the players, so
that no order and no midpoint convention is chosen, and the parts add up to after - before
exactly. ``C`` is a sum of one term per pool, and a pool's term depends on the traffic and on
that pool's own two factors only, so the values are computed pool by pool over at most three
players (Shapley values add over a sum of games).

The shares are taken bucket by bucket, so a period's part of a pool is not ``S w / (w + o)`` of
the period's sums: a view that sent its tokens in minutes the others left quiet paid those
minutes alone. That is the view's own doing, so it belongs to its traffic player as a timing
factor ``D / (S sigma(w, o))`` beside its tokens; the other tokens stay what they were, and a pool
whose other tokens did not change has no volume part. Both sides' levels are the showback's
exactly. Nothing divides by a pool's tokens, so a pool where the view's part is negligible on one
side gives the same parts as a pool where it had none (within float error).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import pandas as pd

from analytics.errors import NoData

__all__ = ["KINDS", "Side", "decompose", "level", "shapley"]

KINDS = ("traffic", "volume", "spend")
SIDE_COLUMNS = ["spend", "view_spend", "view_weighted", "other_weighted"]


@dataclass(frozen=True)
class Side:
    """One period of a view: ``pools`` indexed by pool with ``SIDE_COLUMNS`` (per hour), and the
    view's tokens per hour ``x``."""

    pools: pd.DataFrame
    x: float


def level(side: Side) -> float:
    """The view's cost per token on one side: its part of the spend over its tokens."""
    if side.x <= 0:
        raise NoData("no tokens served")
    return float(side.pools["view_spend"].sum()) / side.x


def shapley(value: Callable[[tuple[bool, ...]], float], n: int) -> list[float]:
    """Each of ``n`` players' Shapley value of the game ``value(changed)`` (``changed[i]``: player
    ``i`` at its after-value): its marginal effect averaged over every order of the players."""
    parts = [0.0] * n
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for k in range(n):
            weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
            for group in combinations(others, k):
                without = tuple(j in group for j in range(n))
                with_i = tuple(j in group or j == i for j in range(n))
                parts[i] += weight * (value(with_i) - value(without))
    return parts


def _sigma(w: float, o: float) -> float:
    total = w + o
    return w / total if total > 0 and not math.isinf(o) else 0.0


def _timing(spend: float, part: float, w: float, o: float) -> float:
    """How the view's part of a pool compares with its share of the period's tokens, ``D / (S
    sigma(w, o))``: 1 where it sent its tokens evenly with the others, above 1 where it sent them in
    minutes the others left quiet (it paid those minutes alone), 0 where they came when the pool
    cost nothing. 1 where the view had no share to compare (its part is 0 then)."""
    base = spend * _sigma(w, o)
    return part / base if base > 0 else 1.0


Pair = tuple[float, float]  # a factor before and after


def _cell(table: pd.DataFrame, pool: str, column: str) -> float:
    return float(table.at[pool, column])  # type: ignore[arg-type]


def _whole_term(spend: Pair, x: Pair) -> Callable[[tuple[bool, ...]], float]:
    """A pool's term of the fleet's (or the pool's own) cost per token: S / x."""

    def term(changed: tuple[bool, ...]) -> float:
        return spend[changed[1]] / x[changed[0]]

    return term


def _shared_term(spend: Pair, w: Pair, o: Pair, t: Pair, x: Pair) -> Callable[[tuple[bool, ...]], float]:
    """A pool's term of a payer's cost per token: S x sigma(w, o) x timing / x."""

    def term(changed: tuple[bool, ...]) -> float:
        own = changed[0]
        return spend[changed[2]] * _sigma(w[own], o[changed[1]]) * t[own] / x[own]

    return term


def decompose(before: Side, after: Side, *, shared: bool) -> pd.DataFrame:
    """The change ``level(after) - level(before)`` as Shapley parts (module docstring).
    ``shared``: the view is a payer (its part of each pool is a share); else it is the fleet or
    one pool, whose part of a pool is all of it. ``ValueError`` when the view served no tokens on
    a side (its cost per token is undefined there)."""
    if before.x <= 0 or after.x <= 0:
        raise NoData("no tokens served " + ("before the break" if before.x <= 0 else "after the break"))
    pools = sorted(set(before.pools.index) | set(after.pools.index))
    b = before.pools.reindex(pools)[SIDE_COLUMNS].fillna(0.0).astype(float)
    a = after.pools.reindex(pools)[SIDE_COLUMNS].fillna(0.0).astype(float)
    rows: list[dict[str, object]] = []
    x = (before.x, after.x)
    for p in pools:
        spend = (_cell(b, p, "spend"), _cell(a, p, "spend"))
        if not shared:  # players: the view's tokens, the pool's spend
            parts = shapley(_whole_term(spend, x), 2)
            rows += [{"kind": "traffic", "pool": p, "usd_per_token": parts[0]}]
            rows += [{"kind": "spend", "pool": p, "usd_per_token": parts[1]}]
            continue
        w = (_cell(b, p, "view_weighted"), _cell(a, p, "view_weighted"))
        o = (_cell(b, p, "other_weighted"), _cell(a, p, "other_weighted"))
        t = (
            _timing(spend[0], _cell(b, p, "view_spend"), w[0], o[0]),
            _timing(spend[1], _cell(a, p, "view_spend"), w[1], o[1]),
        )
        # players: the view's traffic (its tokens here and in all, and when it sent them), the pool's other
        # tokens, its spend
        parts = shapley(_shared_term(spend, w, o, t, x), 3)
        rows += [{"kind": kind, "pool": p, "usd_per_token": part} for kind, part in zip(KINDS, parts, strict=True)]
    return pd.DataFrame(rows, columns=["kind", "pool", "usd_per_token"])
