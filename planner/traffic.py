"""Recorded requests as the arrivals a replay sends: the sampling weights expanded, the traffic
scaled, each prompt rebuilt so that requests which shared a prefix share it again.

In:  request-log rows (``analytics.prefix.recorded_requests``: arrival time, model, route,
     tenant, session, prefix hash, prompt and output tokens, weight), a scale factor, how many
     tokens a prefix hash stands for, a seed.
Out: ``Arrival``s in time order (seconds from the window's start): what the client asked for
     (the model, or the router's ``auto`` name when the model router chose it and a router is
     given: ``auto_model=None`` keeps the model that served it), the tenant, the
     prompt as token ids (the shared prefix from its hash, the rest unique), ``max_tokens`` = the
     output it produced (the traffic generator's requests run to it), and the row's latencies.

A row of weight ``w`` (the log keeps one request in ``w``) becomes ``w`` arrivals on average
(stochastic rounding), the extra ones spread over the time to the next row, so a sampled log
replays as the traffic it stood for rather than as bursts; a scale ``s`` multiplies that. How long
a prefix really is the log does not say: where requests reported cached tokens, their median
for a prefix hash is its length (``analytics.prefix.prefix_lengths``); elsewhere ``prefix_tokens``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analytics.prefix import prefix_lengths

__all__ = ["Arrival", "arrivals"]

VOCAB = 30_000  # token ids of the rebuilt shared prefixes; unique parts count up from beyond it


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the window's start
    model: str  # the model asked for ("auto" when the model router decided)
    tenant: str
    prompt: list[int]
    max_tokens: int  # the output it produced (the replay generates that many tokens)
    key: str  # the affinity key: the session, else the prefix hash
    prefix_hash: str
    asked_tokens: int = 0  # the max_tokens the client asked for (the model router's rule reads it; 0: unknown)


def arrivals(
    rows: pd.DataFrame,
    start: pd.Timestamp,
    *,
    scale: float = 1.0,
    prefix_tokens: int = 64,
    auto_model: str | None = "auto",
    seed: int = 0,
) -> list[Arrival]:
    """The rows as arrivals (see the module docstring)."""
    if scale <= 0:
        raise ValueError(f"the traffic scale must be above 0, not {scale}")
    if rows.empty:
        return []
    rows = rows.sort_values("ts", kind="stable").reset_index(drop=True)
    rng = random.Random(seed)
    at = (pd.to_datetime(rows["ts"], utc=True) - start).dt.total_seconds().to_numpy(float)
    gaps = np.diff(at, append=at[-1] + (at[-1] - at[0]) / max(1, len(at) - 1) if len(at) > 1 else 1.0)
    lengths = {k: int(v) for k, v in prefix_lengths(rows).items()}
    shared: dict[str, list[int]] = {}
    unique = VOCAB
    out: list[Arrival] = []
    records: list[dict[Any, Any]] = rows.to_dict("records")
    for i, row in enumerate(records):
        copies = float(row["weight"]) * scale
        n = int(copies) + (1 if rng.random() < copies - int(copies) else 0)
        route = str(row.get("route") or "")
        # the model router's choice asked for again (a changed rule moves it), unless there is no router to ask
        model = auto_model if auto_model and route.startswith("model-router") else str(row["model"])
        asked = int(row.get("max_tokens") or 0) if pd.notna(row.get("max_tokens")) else 0
        key = str(row["prefix_hash"] or "")
        prompt_len = max(1, int(row["prompt_tokens"]))
        output = max(1, int(row["completion_tokens"]))
        session = str(row.get("session") or "")
        for k in range(n):
            prefix: list[int] = []
            if key:
                length = min(prompt_len, lengths.get(key, prefix_tokens))
                base = shared.get(key)
                if base is None or len(base) < length:
                    seed_ids = random.Random(key)
                    base = shared[key] = [seed_ids.randrange(VOCAB) for _ in range(max(length, len(base or [])))]
                prefix = base[:length]
            rest = prompt_len - len(prefix)
            prompt = prefix + list(range(unique, unique + rest))
            unique += rest
            offset = 0.0 if k == 0 else rng.random() * gaps[i]
            out.append(
                Arrival(
                    at[i] + offset, model, str(row["tenant"]), prompt, output, session or key, key, max(asked, output)
                )
            )
    out.sort(key=lambda a: a.at)
    return out
