"""``explain``'s one sentence, phrased as "consistent with", from the ranked evidence and strata.

In:  an ``Explanation`` with its evidence and onset, the latency and quantile, the strata by
     prompt length and the long-prompt cut.
Out: the sentence; a late scale-out (the regression waited for a replica the autoscaler had
     decided on) is named whenever it scores, even below the top three; the gateway's shedding
     (its answer, not a cause) whenever it shed 1 % of the requests or more, after the causes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analytics.explain.model import GATEWAY_SHED, LATE_SCALE_OUT, Explanation

__all__ = ["sentence"]


def sentence(ex: Explanation, latency: str, q: float, strata: pd.DataFrame, long_tokens: float) -> str:
    assert ex.break_at is not None, "a sentence is said about a break found"
    head = (
        f"p{q * 100:g} {latency.upper()} rose from {_s(ex.before)} to {_s(ex.after)} at "
        f"{ex.break_at:%H:%M:%S} UTC (±{ex.step}s)"
    )
    if ex.onset is not None and ex.onset < ex.break_at:
        first = ex.evidence[ex.evidence["moved_at"] == pd.Timestamp(ex.onset)].iloc[0]["signal"]
        head += f"; it began at {ex.onset:%H:%M:%S}, when the {first} moved"
    causes_only = ex.evidence[ex.evidence["signal"] != GATEWAY_SHED]
    top = causes_only[causes_only["score"] > 0.05].head(3)
    shed = ex.evidence[(ex.evidence["signal"] == GATEWAY_SHED) & (ex.evidence["score"] >= 0.01)]
    shedding = f"; {shed.iloc[0]['detail']}" if len(shed) else ""
    if top.empty:
        return (
            head
            + f"; none of the signals fleetscope watches moved with it (look at deploys and annotations){shedding}."
        )
    causes = [f"{r.signal} ({r.before} -> {r.after})" for r in top.itertuples()]
    bands = strata.set_index("band")
    short = _band(bands, "short")
    long = _band(bands, "long")
    verdict = ""
    if short is not None and pd.notna(short["slowdown"]):
        heavier = (
            long is not None and pd.notna(long["share_after"]) and long["share_after"] - long["share_before"] >= 0.05
        )
        if short["slowdown"] >= 1.5:
            verdict = (
                f"; short prompts slowed too (p{q * 100:g} {_s(short['q_before'])} -> {_s(short['q_after'])}): "
                "everyone got slower, contention" + (" brought on by a heavier mix" if heavier else "")
            )
        elif heavier and long is not None:
            verdict = (
                f"; short prompts kept their latency ({_s(short['q_before'])} -> {_s(short['q_after'])}): "
                f"the mix got heavier (prompts over {long_tokens:,.0f} tokens {long['share_before']:.0%} -> "
                f"{long['share_after']:.0%})"
            )
    late = ex.evidence[(ex.evidence["signal"] == LATE_SCALE_OUT) & (ex.evidence["score"] > 0.05)]
    if len(late) and LATE_SCALE_OUT not in set(top["signal"]):
        r = late.iloc[0]
        verdict += f"; a late scale-out ({r['after']}: {r['score']:.0%} of the regression waited for it)"
    return f"{head}. Consistent with {', '.join(causes)}{verdict}{shedding}."


def _s(seconds: float) -> str:
    """Seconds in words: milliseconds below a tenth of a second (an ITL of 8 ms is not "0.01s")."""
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 0.1 else f"{seconds:.2f}s"


def _band(bands: pd.DataFrame, name: str) -> dict[str, Any] | None:
    """One prompt-length band's row (``share_before``, ``q_before``, ``slowdown``, ...), or None."""
    return {str(k): v for k, v in bands.loc[name].items()} if name in bands.index else None
