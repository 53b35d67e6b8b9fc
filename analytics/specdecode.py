"""Speculative decoding: the engines' draft counters -> how well the drafts are accepted.

In:  a client, a window ``[start, end)``, a grouping (``replica``, ``model`` or ``fleet``) and the
     usual scope (tier, filters); ``acceptance_over_time`` a step too.
Out: - ``acceptance``: ``[<by>, drafts, draft_tokens, accepted, generation_tokens, k,
       acceptance_rate, mean_accepted_length, draft_efficiency, speedup]``, one row per group of
       the replicas that decode speculatively (those reporting ``vllm:spec_decode_*``);
     - ``by_position``: ``[<by>, position, accepted, drafts, rate]``, the share of drafts whose
       token at that position was accepted;
     - ``acceptance_over_time``: ``[ts, <by>, drafts, draft_tokens, accepted, acceptance_rate,
       mean_accepted_length]`` per step.

Definitions (docs/analytics.md "Speculative decoding"), over the window's counter increases:
- acceptance rate = accepted tokens / draft tokens;
- mean accepted length = 1 + accepted / drafts: the tokens one decode step of a request emits,
  the target model's own token included (vLLM's "mean acceptance length");
- acceptance by position i = accepted at position i / drafts (falls with i: a draft token counts
  only when every one before it was accepted);
- draft efficiency = (drafts + accepted) / (drafts x (k + 1)), k = draft tokens / drafts: the
  tokens the steps emitted over the most they could have;
- decode speed-up = generation tokens / (generation tokens - accepted): the decode steps the
  replicas would have taken without drafts over the steps they took; the verification's own
  cost is left out, so it is an upper bound (ngram drafts cost next to nothing to propose).
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.counters import present, series_latest
from analytics.errors import BadInput
from analytics.frames import query_df
from analytics.metrics import counter_increases
from analytics.stalls import replica_models
from analytics.timeseries import counter_rates_over_time
from analytics.vllm import GENERATION_TOKENS, SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS, SPEC_DRAFT_TOKENS, SPEC_DRAFTS
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = ["COUNTERS", "acceptance", "acceptance_over_time", "by_position", "rates"]

COUNTERS = {SPEC_DRAFTS: "drafts", SPEC_DRAFT_TOKENS: "draft_tokens", SPEC_ACCEPTED: "accepted"}
COLUMNS = [
    "drafts",
    "draft_tokens",
    "accepted",
    "generation_tokens",
    "k",
    "acceptance_rate",
    "mean_accepted_length",
    "draft_efficiency",
    "speedup",
]


def rates(df: pd.DataFrame) -> pd.DataFrame:
    """The definitions above on a frame with ``drafts``, ``draft_tokens``, ``accepted`` (and
    ``generation_tokens`` for the speed-up); NaN where there were no drafts."""
    out = df.copy()
    drafts = out["drafts"].where(out["drafts"] > 0)
    tokens = out["draft_tokens"].where(out["draft_tokens"] > 0)
    out["k"] = tokens / drafts
    out["acceptance_rate"] = out["accepted"] / tokens
    out["mean_accepted_length"] = 1 + out["accepted"] / drafts
    out["draft_efficiency"] = (drafts + out["accepted"]) / (drafts * (out["k"] + 1))
    if "generation_tokens" in out:
        steps = (out["generation_tokens"] - out["accepted"]).where(out["generation_tokens"] > out["accepted"])
        out["speedup"] = out["generation_tokens"] / steps
    return out


def _group(df: pd.DataFrame, client: Client, by: str) -> pd.DataFrame:
    """Per-replica rows -> per ``by`` (sums)."""
    if by == "replica":
        return df
    if by == "fleet":
        df = df.assign(fleet="(fleet)")
    else:
        models = replica_models(client)
        df = df.assign(model=df["replica"].map(models).fillna(""))
    return df.drop(columns=["replica"]).groupby(by, as_index=False).sum(numeric_only=True)


def acceptance(
    client: Client, start: datetime, end: datetime, by: str = "replica", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Acceptance per ``by`` over ``[start, end)`` (see the module docstring); no rows where no
    replica decodes speculatively."""
    if by not in ("replica", "model", "fleet"):
        raise BadInput(f"by must be replica, model or fleet, not {by!r}")
    if not present(client, SPEC_DRAFTS):  # no replica ever drafted: one look at the series, not the samples
        return pd.DataFrame(columns=[by, *COLUMNS])
    df = counter_increases(client, [*COUNTERS, GENERATION_TOKENS], start, end, "replica", **scope)
    wide = df.pivot_table(index="replica", columns="metric", values="increase", aggfunc="sum")
    if SPEC_DRAFTS not in wide.columns:
        return pd.DataFrame(columns=[by, *COLUMNS])
    wide = wide[wide[SPEC_DRAFTS].notna()]  # replicas that decode speculatively
    wide = wide.rename(columns={**COUNTERS, GENERATION_TOKENS: "generation_tokens"})
    for column in ("draft_tokens", "accepted", "generation_tokens"):
        if column not in wide:
            wide[column] = 0.0
    base = wide[["drafts", "draft_tokens", "accepted", "generation_tokens"]].fillna(0.0).reset_index()
    base.columns.name = None
    grouped = _group(base, client, by)
    return rates(grouped)[[by, *COLUMNS]].sort_values(by, ignore_index=True)


def by_position(
    client: Client, start: datetime, end: datetime, by: str = "replica", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """The acceptance of each draft position per ``by``: accepted at the position / drafts."""
    if not present(client, SPEC_DRAFTS):
        return pd.DataFrame(columns=[by, "position", "accepted", "drafts", "rate"])
    df = counter_increases(client, [SPEC_ACCEPTED_PER_POS, SPEC_DRAFTS], start, end, "fingerprint", **scope)
    if df.empty:
        return pd.DataFrame(columns=[by, "position", "accepted", "drafts", "rate"])
    labels = query_df(
        client,
        f"SELECT fingerprint, replica, labels['position'] AS position FROM ({series_latest('m', many=True)})",
        parameters={"m": [SPEC_ACCEPTED_PER_POS, SPEC_DRAFTS]},
    )
    df = df.merge(labels, on="fingerprint")
    per_pos = df[df["metric"] == SPEC_ACCEPTED_PER_POS].groupby(["replica", "position"], as_index=False)
    per_replica = df[df["metric"] == SPEC_DRAFTS].groupby("replica", as_index=False)
    pos: pd.DataFrame = per_pos.agg(accepted=("increase", "sum")).merge(
        per_replica.agg(drafts=("increase", "sum")), on="replica", how="left"
    )
    if by != "replica":
        key = "(fleet)" if by == "fleet" else None
        models = replica_models(client) if key is None else {}
        pos[by] = pos["replica"].map(models).fillna("") if key is None else key
        # each replica's drafts once per position row: sum per (group, position)
        pos = pos.groupby([by, "position"], as_index=False)[["accepted", "drafts"]].sum()
    pos["position"] = pos["position"].astype(int)
    pos["rate"] = pos["accepted"] / pos["drafts"].where(pos["drafts"] > 0)
    out: pd.DataFrame = pos[[by, "position", "accepted", "drafts", "rate"]]
    return out.sort_values([by, "position"], ignore_index=True)


def acceptance_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    by: str = "fleet",
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Acceptance per step and ``by``: ``[ts, <by>, drafts, draft_tokens, accepted,
    acceptance_rate, mean_accepted_length]`` (steps without drafts: NaN rates)."""
    df = counter_rates_over_time(client, list(COUNTERS), start, end, by, step=step, **scope)
    columns = ["ts", by, "drafts", "draft_tokens", "accepted", "acceptance_rate", "mean_accepted_length"]
    if df.empty:
        out = pd.DataFrame(columns=columns)
        out.attrs.update(df.attrs)
        return out
    wide = df.pivot_table(index=["ts", by], columns="metric", values="increase", aggfunc="sum").reset_index()
    wide = wide.rename(columns=COUNTERS)
    for column in COUNTERS.values():
        if column not in wide:
            wide[column] = np.nan
    out = rates(wide)[columns].sort_values(["ts", by], ignore_index=True)
    out.columns.name = None
    out.attrs.update(df.attrs)
    return out
